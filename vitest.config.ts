import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"

const source = (path: string) => fileURLToPath(new URL(path, import.meta.url))

export default defineConfig({
  resolve: {
    // The examples and some tests import the package by its name: in a checkout that is the source.
    alias: [
      { find: /^effect-rebuno$/, replacement: source("./src/index.ts") },
      { find: /^effect-rebuno\/kernel$/, replacement: source("./src/kernel/index.ts") },
      { find: /^effect-rebuno\/testing$/, replacement: source("./src/testing/index.ts") }
    ]
  },
  test: {
    include: ["test/**/*.test.ts"],
    // prints the log lines a failing test captured (test/support/logging.ts)
    setupFiles: ["test/support/setup.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000
  }
})
