/**
 * Profiling entry point (not part of `npm run bench`): runs only the SDK side
 * of `step-cost` for a while, for `node --cpu-prof .bench/bench/profile.js`
 * (after `npm run bench` has compiled it).
 *
 * @since 0.1.0
 */
import { profileSdk } from "./stepCost.js"
import { spawnStub } from "./util.js"

const stub = await spawnStub()
const mode = process.argv[2] === "replay" ? "replay" : "proceed"
const steps = Number(process.argv[3] ?? 5000)
await profileSdk(stub.url, mode === "replay", steps)
stub.stop()
process.exit(0)
