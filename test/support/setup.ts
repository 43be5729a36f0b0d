/**
 * Vitest setup (every test file): the log lines a test captured with
 * `test/support/logging.ts` are printed when, and only when, the test fails
 * — so silencing logs never hides what led to a failure.
 *
 * @since 0.2.0
 */
import { beforeEach } from "vitest"
import * as TestLogs from "./logging.js"

beforeEach((context) => {
  TestLogs.reset()
  context.onTestFailed(({ task }) => {
    const logged = TestLogs.lines()
    if (logged.length === 0) return
    process.stderr.write(
      `\n--- log lines captured during the failed test "${task.name}" (${logged.length}) ---\n` +
        logged.join("\n") + "\n--- end of captured log lines ---\n"
    )
  })
})
