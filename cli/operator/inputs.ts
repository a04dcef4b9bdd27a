/**
 * Input values for `deploy create|update` and `cluster create`: `--input k=v` on the command
 * line and `--input-file f.json` (a JSON object; `-` reads standard input), merged with
 * `--input` winning for a key given both ways. A value on the command line sits in
 * /proc/<pid>/cmdline, readable by every local user, for as long as the command runs (a whole
 * `--wait`): the CLI asks the controller which inputs the configs hide and warns on stderr
 * (`hidden_input_in_argv`) for each hidden one given with `--input`.
 */
import fs from 'node:fs/promises';
import { HeraldError } from '../../protocol/errors.js';
import { MAX_REQUEST_BODY_BYTES } from '../../protocol/limits.js';
import type { ApiClient } from './client.js';
import { parseKeyValues } from './format.js';

export const INPUT_FILE_OPTION = '--input-file';

/** The help line of `--input-file`, the same on every command that takes `--input`. */
export const INPUT_FILE_HELP =
  'input values as a JSON object in a file ("-" reads stdin), off the command line where other users can read them; --input wins for a key given both ways';

export interface GatheredInputs {
  /** The merged values, or undefined when neither option was given. */
  values: Record<string, unknown> | undefined;
  /** The names given with `--input` (on the command line). */
  argvNames: string[];
}

function badFile(file: string, why: string, cause?: unknown): HeraldError {
  return new HeraldError(
    'bad_option',
    `${INPUT_FILE_OPTION} ${JSON.stringify(file)} ${why}`,
    cause === undefined ? {} : { cause },
  );
}

async function readCapped(stream: NodeJS.ReadableStream, file: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of stream) {
    const b = typeof chunk === 'string' ? Buffer.from(chunk) : (chunk as Buffer);
    size += b.length;
    if (size > MAX_REQUEST_BODY_BYTES) throw badFile(file, `is over ${MAX_REQUEST_BODY_BYTES} bytes`);
    chunks.push(b);
  }
  return Buffer.concat(chunks);
}

/**
 * Reads an `--input-file`: a JSON object of input values (any JSON value each), at most 1 MiB
 * (the API's body limit). The error never quotes the file's content: it may hold secrets.
 * @throws HeraldError `bad_option` naming `--input-file` when the file cannot be read, is too
 *   large, is not JSON or is not a JSON object
 */
export async function readInputFile(
  file: string,
  stdin: NodeJS.ReadableStream = process.stdin,
): Promise<Record<string, unknown>> {
  let raw: Buffer;
  if (file === '-') {
    raw = await readCapped(stdin, file);
  } else {
    let handle: fs.FileHandle | undefined;
    try {
      handle = await fs.open(file, 'r');
      const st = await handle.stat();
      if (!st.isFile()) throw badFile(file, 'is not a regular file');
      if (st.size > MAX_REQUEST_BODY_BYTES) throw badFile(file, `is over ${MAX_REQUEST_BODY_BYTES} bytes`);
      raw = await readCapped(handle.createReadStream({ autoClose: false }), file);
    } catch (err) {
      if (err instanceof HeraldError) throw err;
      const code = (err as NodeJS.ErrnoException).code ?? 'error';
      throw badFile(file, `cannot be read (${code})`, err);
    } finally {
      await handle?.close();
    }
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw.toString('utf8'));
  } catch {
    // V8's message quotes the text around the fault: never print it
    throw badFile(file, 'is not JSON');
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    const kind = parsed === null ? 'null' : Array.isArray(parsed) ? 'an array' : `a ${typeof parsed}`;
    throw badFile(file, `must hold a JSON object of input values, not ${kind}`);
  }
  return parsed as Record<string, unknown>;
}

/**
 * The values of `--input-file` (when given) overlaid with `--input` pairs.
 * @throws HeraldError `bad_option` naming `--input` or `--input-file`
 */
export async function gatherInputs(
  o: { input?: string[]; inputFile?: string },
  stdin?: NodeJS.ReadableStream,
): Promise<GatheredInputs> {
  const argv = parseKeyValues(o.input, '--input');
  const fromFile = o.inputFile === undefined ? undefined : await readInputFile(o.inputFile, stdin);
  if (argv === undefined && fromFile === undefined) return { values: undefined, argvNames: [] };
  // fromEntries defines own properties, so a key like "__proto__" stays a key the API will judge
  const values = Object.fromEntries([...Object.entries(fromFile ?? {}), ...Object.entries(argv ?? {})]);
  return { values, argvNames: Object.keys(argv ?? {}) };
}

/** The warning line for a hidden input given on the command line. */
export function hiddenOnArgvWarning(name: string, option = '--input'): string {
  return `herald: warning: hidden_input_in_argv: the hidden input ${JSON.stringify(name)} was given with ${option}, where every local user can read it in the process list while this command runs; use ${INPUT_FILE_OPTION} instead\n`;
}

/**
 * Warns on stderr for each name in `argvNames` that one of the configs marks hidden. The
 * configs are fetched from the controller; one that cannot be fetched is skipped (the request
 * that follows reports why).
 */
export async function warnHiddenOnArgv(
  client: ApiClient,
  configIds: Array<string | undefined>,
  argvNames: string[],
  write: (s: string) => void = (s) => process.stderr.write(s),
): Promise<void> {
  if (argvNames.length === 0) return;
  const hidden = new Set<string>();
  for (const id of new Set(configIds.filter((x): x is string => typeof x === 'string' && x !== ''))) {
    try {
      const c = await client.get<{ inputs?: unknown }>(`/v1/configs/${encodeURIComponent(id)}`);
      if (Array.isArray(c?.inputs)) {
        for (const i of c.inputs as Array<{ name?: unknown; hidden?: unknown }>)
          if (i?.hidden === true && typeof i.name === 'string') hidden.add(i.name);
      }
    } catch {
      // unknown config or no access: the create/update request says so with its code
    }
  }
  for (const name of argvNames) if (hidden.has(name)) write(hiddenOnArgvWarning(name));
}
