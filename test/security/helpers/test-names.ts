/**
 * Reading test names out of a test file's source, for claims.test.ts: does a full vitest name
 * (describe titles and the test's own title, joined by spaces) name a test of the file?
 */

/** The string literals of a source file (quotes undone), and which of them title a describe. */
function literals(src: string): { all: Set<string>; describes: Set<string>; templates: RegExp[] } {
  const all = new Set<string>();
  const describes = new Set<string>();
  const templates: RegExp[] = [];
  const unquote = (q: string, body: string): string =>
    body.replace(/\\(.)/g, '$1').replace(q === '`' ? /\$\{[^}]*\}/g : /$^/, '');
  for (const m of src.matchAll(/(['"`])((?:\\.|(?!\1)[^\\\n])*)\1/g)) all.add(unquote(m[1]!, m[2]!));
  // a call's arguments, nested parentheses two deep: `describe.skipIf(!built)(`, `it.each(xs.map((x) => x))(`
  const args = String.raw`\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)`;
  const quoted = String.raw`(['"\x60])((?:\\.|(?!\1)[^\\\n])*)\1`;
  for (const m of src.matchAll(new RegExp(String.raw`\bdescribe(?:\.\w+(?:${args})?)*\(\s*${quoted}`, 'g')))
    describes.add(unquote(m[1]!, m[2]!));
  for (const m of src.matchAll(new RegExp(String.raw`\b(?:it|test)(?:\.\w+(?:${args})?)*\(\s*${quoted}`, 'g'))) {
    if (!m[2]!.includes('%s')) continue;
    const t = unquote(m[1]!, m[2]!);
    if (t === '%s') continue; // rows are literals already
    templates.push(
      new RegExp(
        `^${t
          .split('%s')
          .map((x) => x.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'))
          .join('.+')}$`,
      ),
    );
  }
  return { all, describes, templates };
}

/** Can `name` be read as one or more describe titles followed by a test title of the file? */
export function namesATest(name: string, src: string): boolean {
  const { all, describes, templates } = literals(src);
  const isTitle = (t: string): boolean => all.has(t) || templates.some((re) => re.test(t));
  // positions where a describe chain may end (each describe title followed by a space)
  const reach = new Set<number>([0]);
  const queue = [0];
  while (queue.length > 0) {
    const at = queue.shift()!;
    for (const d of describes) {
      if (d !== '' && name.startsWith(`${d} `, at)) {
        const next = at + d.length + 1;
        if (!reach.has(next)) {
          reach.add(next);
          queue.push(next);
        }
      }
    }
  }
  return [...reach].some((at) => at > 0 && isTitle(name.slice(at)));
}
