/**
 * `effect-rebuno/testing`: the test kit. The embedded kernel's core in-process,
 * driven by `TestClock`.
 *
 * @since 0.1.0
 */

/**
 * @since 0.1.0
 */
export * as TestKernel from "./TestKernel.js"
