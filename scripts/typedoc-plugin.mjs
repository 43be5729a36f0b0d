// A TypeDoc plugin for this package's doc-comment conventions (Effect's):
// - the three entry modules are named after their import paths
//   (`effect-rebuno`, `effect-rebuno/kernel`, `effect-rebuno/testing`), not
//   their file names (`index`, `kernel`, `testing`);
// - a module's overview is the first doc comment of its file (no `@module`
//   tag needed): it becomes the comment of the entry module, and of each
//   `export * as Name from "./Name.js"` namespace.
import { Comment, Converter, MinimalSourceFile, ReflectionKind, TypeScript as ts } from "typedoc"

const names = new Map([
  ["index", "effect-rebuno"],
  ["kernel", "effect-rebuno/kernel"],
  ["testing", "effect-rebuno/testing"]
])

/** The text of the first `/** … *\/` comment at the top of a file, without its block tags. */
const fileOverview = (file) => {
  const text = file.text.replace(/^#!.*\n/, "")
  const match = /^\s*\/\*\*([\s\S]*?)\*\//.exec(text)
  if (match === null) return undefined
  const lines = match[1].split("\n").map((line) => line.replace(/^\s*\* ?/, ""))
  const tag = lines.findIndex((line) => /^@\w/.test(line))
  const summary = (tag === -1 ? lines : lines.slice(0, tag)).join("\n").trim()
  return summary === "" ? undefined : summary
}

/** @param {import("typedoc").Application} app */
export const load = (app) => {
  app.converter.on(Converter.EVENT_CREATE_DECLARATION, (context, reflection) => {
    if (!reflection.kindOf(ReflectionKind.Module | ReflectionKind.Namespace)) return
    if (reflection.comment?.summary.some((part) => part.text.trim() !== "")) return
    let symbol = context.getSymbolFromReflection(reflection)
    if (symbol !== undefined && symbol.flags & ts.SymbolFlags.Alias) symbol = context.checker.getAliasedSymbol(symbol)
    const file = symbol?.declarations?.find(ts.isSourceFile)
    if (file === undefined) return
    const overview = fileOverview(file)
    if (overview === undefined) return
    const { content } = app.converter.parseRawComment(new MinimalSourceFile(overview, file.fileName), context.project.files)
    reflection.comment = new Comment(content, reflection.comment?.blockTags ?? [], reflection.comment?.modifierTags)
  })
  app.converter.on(Converter.EVENT_RESOLVE_BEGIN, (context) => {
    for (const module of context.project.getChildrenByKind(ReflectionKind.Module)) {
      const name = names.get(module.name)
      if (name !== undefined) module.name = name
    }
  })
}
