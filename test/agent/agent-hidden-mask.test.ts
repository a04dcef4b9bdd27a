/**
 * Hidden input values printed by a real hook are masked before anything keeps them (docs/architecture.md):
 * in stdout and stderr (a value the pipe delivers in two pieces included), in a Heat-protocol
 * hook's answer and outputs, in the JSON-encoded form of a hidden list, and at a cut tail's start.
 */
import { chmod, mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hiddenValues, maskText, MASK } from '../../agent/hooks/mask.js';
import { runItem } from '../../agent/hooks/run-item.js';
import type { MetadataInput } from '../../protocol/heat.js';
import { cutMarker } from '../../protocol/heat.js';
import { item, tempDir } from './hooks-helpers.js';

const SECRET = 'hunter2-Zq9xVb7';
let base: string;
let hooksDir: string;

beforeAll(async () => {
  base = await tempDir();
  await chmod(base, 0o755);
  hooksDir = join(base, 'hooks');
  await mkdir(hooksDir, { mode: 0o755 });
  // a Heat-protocol hook that repeats its hidden input everywhere it can
  await writeFile(
    join(hooksDir, 'leaky'),
    `#!${process.execPath}
let s = '';
process.stdin.on('data', (b) => { s += b; });
process.stdin.on('end', () => {
  const item = JSON.parse(s);
  const pw = item.inputs.find((i) => i.name === 'db_password').value;
  process.stderr.write('connecting with ' + pw + '\\n');
  process.stdout.write(JSON.stringify({ deploy_stdout: 'pw=' + pw, deploy_stderr: 'err ' + pw, deploy_status_code: 0, result: { nested: ['x' + pw + 'y'] } }));
});
`,
    { mode: 0o755 },
  );
  await chmod(join(hooksDir, 'leaky'), 0o755);
});
afterAll(async () => rm(base, { recursive: true, force: true }));

const opts = () => ({ runsDir: join(base, 'runs'), hooksDir, uid: 1000, env: { PATH: process.env.PATH } });
const hidden = (name: string, value: unknown, type: MetadataInput['type'] = 'String'): MetadataInput => ({
  name,
  type,
  value,
  hidden: true,
});

describe('hidden values in hook output', () => {
  it('a script printing the secret (in two pieces, with a pause between writes) shows *** in stdout, stderr and outputs', async () => {
    const it1 = item({
      config: [
        '#!/bin/sh',
        'echo "password is $db_password"',
        'echo "to stderr: $db_password" >&2',
        // half, flush, pause, other half: two chunks on the pipe
        'half=$(printf %s "$db_password" | cut -c1-7); rest=$(printf %s "$db_password" | cut -c8-)',
        'printf "split:%s" "$half"; sleep 0.2; printf "%s:end\\n" "$rest"',
        'echo "not hidden: $port"',
        'printf "out:%s" "$db_password" > "$heat_outputs_path.result"',
      ].join('\n'),
      inputs: [hidden('db_password', SECRET), { name: 'port', type: 'String', value: '5432' }],
      outputs: [{ name: 'result', type: 'String', error_output: false }],
    });
    const r = await runItem(it1, opts());
    expect(r.deploy_status_code).toBe(0);
    expect(JSON.stringify(r)).not.toContain(SECRET);
    expect(r.deploy_stdout).toBe(`password is ${MASK}\nsplit:${MASK}:end\nnot hidden: 5432\n`);
    expect(r.deploy_stderr).toBe(`to stderr: ${MASK}\n`);
    expect(r.outputs).toEqual({ result: `out:${MASK}` });
  });

  it('a Heat-protocol hook echoing the secret in its answer and outputs is masked there too', async () => {
    const r = await runItem(
      item({
        group: 'leaky',
        inputs: [hidden('db_password', SECRET)],
        outputs: [{ name: 'result', type: 'Json', error_output: false }],
      }),
      opts(),
    );
    expect(r.deploy_status_code).toBe(0);
    expect(JSON.stringify(r)).not.toContain(SECRET);
    expect(r.deploy_stdout).toBe(`pw=${MASK}`);
    expect(r.deploy_stderr).toBe(`err ${MASK}`);
    expect(r.outputs).toEqual({ result: { nested: [`x${MASK}y`] } });
  });

  it('a hidden list is masked in the JSON form the script sees; an input not hidden is not masked', async () => {
    const r = await runItem(
      item({
        config: '#!/bin/sh\necho "keys=$keys"\necho "user=$user"\n',
        inputs: [
          hidden('keys', ['k1-abcdef', 'k2-ghijkl'], 'CommaDelimitedList'),
          { name: 'user', type: 'String', value: 'k1-abcdef' },
        ],
      }),
      opts(),
    );
    expect(r.deploy_stdout).toBe(`keys=${MASK}\nuser=k1-abcdef\n`);
  });

  it('the tail of a long output, cut inside a secret, masks what is left of it', () => {
    const kept = `${cutMarker(100)}${SECRET.slice(5)} and more\n`;
    expect(maskText(kept, hiddenValues([hidden('p', SECRET)]))).toBe(`${cutMarker(100)}${MASK} and more\n`);
  });

  it('empty hidden values mask nothing; JSON-escaped forms are masked', () => {
    expect(hiddenValues([hidden('a', ''), { name: 'b', type: 'String', value: 'x' }])).toEqual([]);
    const v = hiddenValues([hidden('q', 'a"b\\c')]);
    expect(maskText('raw a"b\\c json "a\\"b\\\\c"', v)).toBe(`raw ${MASK} json "${MASK}"`);
  });
});
