/**
 * `effect-rebuno/testing`: the test kit. The embedded kernel's core in-process,
 * driven by `TestClock`, and crash exploration on top of it.
 *
 * @since 0.1.0
 */

/**
 * @since 0.1.0
 */
export * as TestKernel from "./TestKernel.js"

/**
 * @since 0.1.0
 */
export * as Explore from "./Explore.js"
