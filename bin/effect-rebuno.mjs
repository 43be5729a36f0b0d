#!/usr/bin/env node
// Runs the TypeScript CLI through tsx so the package works from a checkout and from npm alike.
import { register } from "tsx/esm/api"
register()
await import("../src/bin/cli.ts")
