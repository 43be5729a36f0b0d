// A TypeDoc plugin: names the three entry modules after their import paths
// (`effect-rebuno`, `effect-rebuno/kernel`, `effect-rebuno/testing`) instead of
// their file names (`index`, `kernel`, `testing`).
import { Converter, ReflectionKind } from "typedoc"

const names = new Map([
  ["index", "effect-rebuno"],
  ["kernel", "effect-rebuno/kernel"],
  ["testing", "effect-rebuno/testing"]
])

/** @param {import("typedoc").Application} app */
export const load = (app) => {
  app.converter.on(Converter.EVENT_RESOLVE_BEGIN, (context) => {
    for (const module of context.project.getChildrenByKind(ReflectionKind.Module)) {
      const name = names.get(module.name)
      if (name !== undefined) module.name = name
    }
  })
}
