/**
 * `effect-rebuno/testing`: the test kit. The embedded kernel's core in-process,
 * driven by `TestClock`, crash exploration and "what if" forks on top of it,
 * and an in-memory resource driver (`MemoryDirectory`).
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

/**
 * @since 0.2.0
 */
export * as MemoryDirectory from "./MemoryDirectory.js"
