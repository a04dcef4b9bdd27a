/**
 * Builds API request bodies from command-line options where that takes more than a line:
 * `herald config create` (the file, its inputs, outputs and options).
 */
import fs from 'node:fs/promises';
import { HeraldError } from '../../protocol/errors.js';
import { parseDuration, parseInputDecl, parseOutputDecl } from './format.js';

/** Largest config file the CLI sends (the API's body limit is 1 MiB in all). */
export const MAX_CONFIG_FILE_BYTES = 1024 * 1024;

/**
 * Reads the config file, or stdin for `-`.
 * @throws HeraldError `bad_option` naming --file
 */
export async function readConfigFile(file: string): Promise<string> {
  let buf: Buffer;
  try {
    if (file === '-') {
      const chunks: Buffer[] = [];
      for await (const c of process.stdin) chunks.push(c as Buffer);
      buf = Buffer.concat(chunks);
    } else {
      buf = await fs.readFile(file);
    }
  } catch (err) {
    throw new HeraldError(
      'bad_option',
      `--file ${file}: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'not found' : (err as Error).message}`,
      { cause: err },
    );
  }
  if (buf.length > MAX_CONFIG_FILE_BYTES)
    throw new HeraldError('bad_option', `--file ${file} is over ${MAX_CONFIG_FILE_BYTES} bytes`);
  return buf.toString('utf8');
}

export interface ConfigCreateOptions {
  name: string;
  group: string;
  text: string;
  input?: string[];
  hiddenInput?: string[];
  output?: string[];
  errorOutput?: string[];
  hiddenOutput?: string[];
  hookTimeout?: string;
}

/**
 * The body of `POST /v1/configs`. A `component` config's file is JSON (`{"configs":[..]}`);
 * any other group's is sent as the script text.
 * @throws HeraldError `bad_option` naming the option
 */
export function buildConfigRequest(o: ConfigCreateOptions): Record<string, unknown> {
  let config: unknown = o.text;
  if (o.group === 'component') {
    try {
      config = JSON.parse(o.text);
    } catch {
      throw new HeraldError(
        'bad_option',
        '--file: a component config must be JSON ({"configs":[{"actions":[..],"tool":"script","config":".."}]})',
      );
    }
  }
  const inputs = [
    ...(o.input ?? []).map((s) => parseInputDecl(s, '--input')),
    ...(o.hiddenInput ?? []).map((s) => parseInputDecl(s, '--hidden-input', true)),
  ];
  const outputs = [
    ...(o.output ?? []).map((s) => parseOutputDecl(s, '--output')),
    ...(o.errorOutput ?? []).map((s) => parseOutputDecl(s, '--error-output', true)),
    ...(o.hiddenOutput ?? []).map((s) => parseOutputDecl(s, '--hidden-output', false, true)),
  ];
  const req: Record<string, unknown> = { name: o.name, group: o.group, config };
  if (inputs.length) req.inputs = inputs;
  if (outputs.length) req.outputs = outputs;
  if (o.hookTimeout !== undefined)
    req.options = { timeout: Math.ceil(parseDuration(o.hookTimeout, '--hook-timeout') / 1000) };
  return req;
}
