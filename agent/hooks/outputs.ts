/**
 * Reads a script's declared outputs from `${heat_outputs_path}.<name>` (docs/architecture.md): opened with
 * O_NOFOLLOW (a symlink is never followed) and O_NONBLOCK (a FIFO cannot stall the agent), kept
 * only when fstat says regular file and it is at most MAX_OUTPUT_FILE_BYTES. A missing file means
 * the output is absent, as in Heat.
 */
import { constants as fsc } from 'node:fs';
import { type FileHandle, open } from 'node:fs/promises';
import type { ErrorCode } from '../../protocol/errors.js';

export interface OutputProblem {
  name: string;
  code: Extract<ErrorCode, 'output_not_regular' | 'output_too_large'>;
  message: string;
}

export interface ReadOutputsResult {
  values: Record<string, string>;
  problems: OutputProblem[];
}

/** `names` must have been checked with checkOutputName. */
export async function readOutputs(outputsPath: string, names: string[], maxBytes: number): Promise<ReadOutputsResult> {
  const values: Record<string, string> = {};
  const problems: OutputProblem[] = [];
  for (const name of names) {
    const r = await readOne(`${outputsPath}.${name}`, maxBytes);
    if (r.kind === 'value') values[name] = r.value;
    else if (r.kind === 'not_regular')
      problems.push({
        name,
        code: 'output_not_regular',
        message: `output ${name} is a symlink or not a regular file; not read`,
      });
    else if (r.kind === 'too_large')
      problems.push({ name, code: 'output_too_large', message: `output ${name} is over ${maxBytes} bytes; not read` });
  }
  return { values, problems };
}

type ReadOne = { kind: 'value'; value: string } | { kind: 'absent' } | { kind: 'not_regular' } | { kind: 'too_large' };

async function readOne(path: string, maxBytes: number): Promise<ReadOne> {
  let fh: FileHandle;
  try {
    fh = await open(path, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return { kind: 'absent' };
    if (code === 'ELOOP') return { kind: 'not_regular' };
    throw err;
  }
  try {
    const st = await fh.stat();
    if (!st.isFile()) return { kind: 'not_regular' };
    if (st.size > maxBytes) return { kind: 'too_large' };
    // Read one byte past the limit: a file still growing (a daemon writing) is caught as well.
    const buf = Buffer.alloc(maxBytes + 1);
    let n = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, n, buf.length - n, n);
      if (bytesRead === 0) break;
      n += bytesRead;
      if (n > maxBytes) return { kind: 'too_large' };
    }
    return { kind: 'value', value: buf.subarray(0, n).toString('utf8') };
  } finally {
    await fh.close();
  }
}
