#!/usr/bin/env node
/**
 * The `effect-rebuno` binary. It turns on Node's module compile cache
 * (`module.enableCompileCache`, Node ≥ 22.1; `NODE_DISABLE_COMPILE_CACHE=1`
 * turns it off, `NODE_COMPILE_CACHE` chooses its directory), so that a second
 * start does not compile the few hundred modules of the kernel and `effect`
 * again, and only then loads the command line (`main.js`) and runs it.
 *
 * @since 0.1.0
 */
import * as Module from "node:module"

try {
  Module.enableCompileCache?.()
} catch {
  // No cache (a read-only or missing temporary directory): the modules are compiled as usual.
}

const { main } = await import("./main.js")
main()
