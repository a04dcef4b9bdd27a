/**
 * Live output end to end (docs/api.md): real `bin/herald` controller and agent processes
 * on 127.0.0.1. A running hook's output is seen through `/v1/events` while it runs, kept (the
 * last 1 MiB per revision) and served by `GET /v1/deployments/{id}/output`, with hidden values
 * masked before anything leaves the node. Needs `npm run build` first.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  makeCluster,
  mkConfig,
  mkDeployment,
  waitDeployment,
  type AgentProc,
  type Cluster,
} from '../helpers/agent-cluster.js';
import { readEvents, type ReceivedEvent } from '../helpers/event-stream.js';
import { api, credOf, HERALD, heraldSync, isBuilt, killAll, stopProc, waitFor } from '../helpers/procs.js';
import { OUTPUT_RATE_BURST } from '../../protocol/limits.js';
import { metricSum } from '../security/helpers/battery.js';

const built = isBuilt();
let c: Cluster;
let n1: AgentProc;

beforeAll(async () => {
  if (!built) return;
  c = await makeCluster(['n1', 'n2']);
  n1 = await c.startAgent('n1');
}, 60_000);

afterAll(async () => {
  await killAll();
  c?.cleanup();
});

const outputOf = (events: ReceivedEvent[], id: string): ReceivedEvent[] =>
  events.filter((e) => e.event === 'output' && e.data.deployment_id === id);

const SECRET = 'Zq9-hunter2-Xy7';
/** Every piece of the secret long enough to mean something. */
const SECRET_PIECES = [SECRET, SECRET.slice(0, 8), SECRET.slice(8), 'hunter2'];

describe.skipIf(!built)('live output end to end', { timeout: 90_000 }, () => {
  it('streams a hook printing a line every 100 ms for 3 s line by line through /v1/events while it runs', async () => {
    const stamp = path.join(c.work, 'last-line-at');
    const cfg = await mkConfig(c, {
      name: 'ticker',
      group: 'script',
      config: `#!/bin/sh\ni=1\nwhile [ $i -le 30 ]; do\n  [ $i -eq 30 ] && date +%s%3N > ${stamp}\n  echo "line $i $(date +%s%3N)"\n  i=$((i+1))\n  sleep 0.1\ndone\n`,
    });
    const ev = readEvents(c.ctl.port, c.op);
    await ev.opened;
    try {
      const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
      const d = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 20_000);
      expect(d.status).toBe('COMPLETE');
      // the push connection's state reaches a subscriber too: connected, with a wake-up acked
      const pushed = ev.events.filter((e) => e.event === 'push' && e.data.node === 'n1');
      expect(pushed.some((e) => e.data.connected === true && e.data.generation_acked >= 1)).toBe(true);
      await waitFor('the last line as an event', () =>
        outputOf(ev.events, id)
          .map((e) => e.data.text)
          .join('')
          .includes('line 30 '),
      );
      const chunks = outputOf(ev.events, id);
      // numbered in order, and the text is the hook's lines in order, each once
      expect(chunks.map((e) => e.data.seq)).toEqual(chunks.map((_, i) => i + 1));
      const lines = chunks
        .map((e) => e.data.text)
        .join('')
        .trimEnd()
        .split('\n');
      expect(lines.map((l: string) => l.split(' ').slice(0, 2).join(' '))).toEqual(
        Array.from({ length: 30 }, (_, i) => `line ${i + 1}`),
      );
      // many chunks, not one at the end
      expect(chunks.length).toBeGreaterThanOrEqual(8);
      // the first line arrived while the hook was still running, within 1 s of being printed
      const lastLineAt = Number(fs.readFileSync(stamp, 'utf8'));
      const first = chunks[0]!;
      expect(first.at).toBeLessThan(lastLineAt);
      const printedAt = Number(String(first.data.text).split('\n')[0]!.split(' ')[2]);
      expect(first.at - printedAt).toBeLessThan(1_000);
      // what is kept is the same text, with the sequence range
      const kept = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output`);
      expect(kept.status).toBe(200);
      expect(kept.json.stdout.text).toBe(chunks.map((e) => e.data.text).join(''));
      expect(kept.json.stdout.first_seq).toBe(1);
      expect(kept.json.stdout.last_seq).toBe(chunks.length);
      expect(kept.json.signalled).toBe(true);
      expect(kept.json.stderr).toEqual({ text: '', first_seq: null, last_seq: null });
    } finally {
      ev.close();
    }
  });

  it('never lets a hidden value out: not in a chunk, an event, the kept output or the signal (whole, and split across two writes 300 ms apart)', async () => {
    const cfg = await mkConfig(c, {
      name: 'leaky',
      group: 'script',
      config: [
        '#!/bin/sh',
        'echo "whole: $pw"',
        'echo "on stderr: $pw" >&2',
        'printf "split: %s" "$(echo "$pw" | cut -c1-8)"',
        'sleep 0.3',
        'printf "%s end\\n" "$(echo "$pw" | cut -c9-)"',
        'printf "err split: %s" "$(echo "$pw" | cut -c1-8)" >&2',
        'sleep 0.3',
        'printf "%s end\\n" "$(echo "$pw" | cut -c9-)" >&2',
        '',
      ].join('\n'),
      inputs: [{ name: 'pw', type: 'String', hidden: true }],
    });
    const ev = readEvents(c.ctl.port, c.op);
    await ev.opened;
    try {
      const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE', input_values: { pw: SECRET } });
      const d = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 20_000);
      expect(d.status).toBe('COMPLETE');
      await waitFor('the last stderr chunk', () =>
        outputOf(ev.events, id).some((e) => e.data.stream === 'stderr' && String(e.data.text).includes('end')),
      );
      const kept = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output`);
      expect(kept.json.stdout.text).toBe('whole: ***\nsplit: *** end\n');
      expect(kept.json.stderr.text).toBe('on stderr: ***\nerr split: *** end\n');
      expect(d.output_values.deploy_stdout).toBe('whole: ***\nsplit: *** end\n');
      const everything = [JSON.stringify(ev.events), kept.raw, JSON.stringify(d)];
      for (const text of everything) for (const piece of SECRET_PIECES) expect(text).not.toContain(piece);
    } finally {
      ev.close();
    }
  });

  it('never lets a hidden value out in the forms JSON encoders print it: Python json.dumps, Go, PHP, upper-case hex, a surrogate pair (in chunks, events, the kept output, the signal, deploy show and deploy logs)', async () => {
    const values = { city: 'Zürich/2026', tag: '<b>"x"&amp;</b>', emoji: 'key-😀-Zz' };
    const cfg = await mkConfig(c, {
      name: 'encoders',
      group: 'script',
      config: [
        '#!/bin/sh',
        // a real encoder: Python writes non-ASCII as \uXXXX and the emoji as a surrogate pair
        `python3 -c 'import json,os; [print("py:", json.dumps(os.environ[k])) for k in ("city", "tag", "emoji")]'`,
        `python3 -c 'import json,os,sys; print("py-err:", json.dumps(os.environ["city"]), file=sys.stderr)'`,
        // the escaped emoji split inside an escape, across two flushes
        `python3 -c 'import json,os,sys,time; s = json.dumps(os.environ["emoji"]); sys.stdout.write("split: " + s[:7]); sys.stdout.flush(); time.sleep(0.3); print(s[7:], "end")'`,
        // what Go's encoding/json and PHP's json_encode print, written out
        `printf '%s\\n' 'go: \\u003cb\\u003e\\"x\\"\\u0026amp;\\u003c/b\\u003e'`,
        `printf '%s\\n' 'php: Z\\u00fcrich\\/2026'`,
        `printf '%s\\n' 'upper: key-\\uD83D\\uDE00-Zz'`,
        `printf '%s' 'out: Z\\u00FCrich\\/2026' > "$heat_outputs_path.result"`,
        '',
      ].join('\n'),
      inputs: Object.keys(values).map((name) => ({ name, type: 'String', hidden: true })),
      outputs: [{ name: 'result', type: 'String' }],
    });
    const ev = readEvents(c.ctl.port, c.op);
    await ev.opened;
    try {
      const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE', input_values: values });
      const d = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 20_000);
      expect(d.status).toBe('COMPLETE');
      const stdout = 'py: "***"\npy: "***"\npy: "***"\nsplit: "***" end\ngo: ***\nphp: ***\nupper: ***\n';
      await waitFor('the last stdout chunk', () =>
        outputOf(ev.events, id)
          .filter((e) => e.data.stream === 'stdout')
          .map((e) => e.data.text)
          .join('')
          .endsWith('upper: ***\n'),
      );
      const streamed = (s: string): string =>
        outputOf(ev.events, id)
          .filter((e) => e.data.stream === s)
          .map((e) => e.data.text)
          .join('');
      expect(streamed('stdout')).toBe(stdout);
      const kept = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output`);
      expect(kept.json.stdout.text).toBe(stdout);
      expect(kept.json.stderr.text).toBe('py-err: "***"\n');
      // the signal
      expect(d.output_values.deploy_stdout).toBe(stdout);
      expect(d.output_values.deploy_stderr).toBe('py-err: "***"\n');
      expect(d.output_values.result).toBe('out: ***');
      const cli = ['--controller', `https://127.0.0.1:${c.ctl.port}`, '--pki', c.pki];
      const show = heraldSync(['deploy', 'show', id, ...cli]);
      const logs = heraldSync(['deploy', 'logs', id, ...cli]);
      expect(show.code).toBe(0);
      expect(logs.code).toBe(0);
      expect(logs.out).toBe(stdout);
      const everything = [JSON.stringify(ev.events), kept.raw, JSON.stringify(d), show.out, logs.out, logs.err];
      // what is left of any form of the three values once its neighbours are gone
      const pieces = ['rich', 'ü', 'u00fc', 'u00FC', 'ud83d', 'uD83D', 'ude00', 'uDE00', '😀', '-Zz', 'amp;', 'u003c'];
      for (const text of everything) for (const piece of pieces) expect(text).not.toContain(piece);
    } finally {
      ev.close();
    }
  });

  it('keeps a chunk sent twice once, and refuses another node posting output (403 wrong_node)', async () => {
    // a hook that runs until told to end: chunks are taken only while its revision has no result
    const go = path.join(c.work, 'twice-go');
    const cfg = await mkConfig(c, {
      name: 'short',
      group: 'script',
      config: `#!/bin/sh\necho short\nwhile [ ! -e ${go} ]; do sleep 0.05; done\n`,
    });
    const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
    const running = await waitFor('the run started', async () => {
      const r = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output`);
      return r.json?.stdout?.text === 'short\n' ? r.json : null;
    });
    const body = { revision: running.revision, stream: 'stderr', seq: 1000, text: 'posted twice\n' };
    const path1 = `/v1/nodes/n1/deployments/${id}/output`;
    const a = await api(c.ctl.port, n1.cred, 'POST', path1, body);
    const b = await api(c.ctl.port, n1.cred, 'POST', path1, body);
    expect(a.status).toBe(200);
    expect(a.json).toEqual({ seq: 1000, duplicate: false });
    expect(b.status).toBe(200);
    expect(b.json).toEqual({ seq: 1000, duplicate: true });
    const kept = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output`);
    expect(kept.json.stderr.text).toBe('posted twice\n');

    const other = await api(c.ctl.port, credOf(c.pki, 'agent', 'n2'), 'POST', path1, { ...body, seq: 1001 });
    expect(other.status).toBe(403);
    expect(other.json.error.code).toBe('wrong_node');
    const wrongRoute = await api(
      c.ctl.port,
      credOf(c.pki, 'agent', 'n2'),
      'POST',
      `/v1/nodes/n2/deployments/${id}/output`,
      {
        ...body,
        seq: 1002,
      },
    );
    expect(wrongRoute.status).toBe(404); // not n2's deployment
    const asOperator = await api(c.ctl.port, c.op, 'POST', path1, { ...body, seq: 1003 });
    expect(asOperator.status).toBe(403);
    fs.writeFileSync(go, '');
    expect((await waitDeployment(c, id)).status).toBe('COMPLETE');
  });

  it('refuses an empty chunk (400 empty_chunk) and any chunk once the revision has its result (409 output_closed): a finished log cannot be added to or rewritten', async () => {
    const go = path.join(c.work, 'closed-go');
    const cfg = await mkConfig(c, {
      name: 'closes',
      group: 'script',
      config: `#!/bin/sh\necho "the real log"\nwhile [ ! -e ${go} ]; do sleep 0.05; done\n`,
    });
    const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
    const running = await waitFor('the run started', async () => {
      const r = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output`);
      return r.json?.stdout?.text === 'the real log\n' ? r.json : null;
    });
    const route = `/v1/nodes/n1/deployments/${id}/output`;
    const chunk = { revision: running.revision, stream: 'stdout', seq: 500, text: '' };
    const empty = await api(c.ctl.port, n1.cred, 'POST', route, chunk);
    expect(empty.status).toBe(400);
    expect(empty.json.error.code).toBe('empty_chunk');
    fs.writeFileSync(go, '');
    const d = await waitDeployment(c, id);
    expect(d.status).toBe('COMPLETE');
    const seq = running.stdout.last_seq as number;
    for (const late of [
      { ...chunk, seq: seq + 100, text: 'appended after the result\n' },
      { ...chunk, seq, text: 'the log rewritten\n' },
    ]) {
      const r = await api(c.ctl.port, n1.cred, 'POST', route, late);
      expect(r.status).toBe(409);
      expect(r.json.error.code).toBe('output_closed');
    }
    const kept = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output`);
    expect(kept.json.signalled).toBe(true);
    expect(kept.json.stdout.text).toBe('the real log\n');
  });

  it(`back-to-back runs that print on both streams, past the output burst (${OUTPUT_RATE_BURST}): each run's output is kept whole and no chunk is refused`, async () => {
    const refused = async (): Promise<number> =>
      metricSum(
        (await api(c.ctl.port, c.op, 'GET', '/metrics')).raw,
        'herald_api_refusals_total',
        (l) => l.code === 'rate_limited',
      );
    const before = await refused();
    const cfg = await mkConfig(c, {
      name: 'chatty',
      group: 'script',
      config: '#!/bin/sh\necho "run $k"\necho "warn $k" >&2\n',
      inputs: [{ name: 'k' }],
    });
    const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE', input_values: { k: '0' } });
    let d = await waitDeployment(c, id);
    const runs = OUTPUT_RATE_BURST + 10; // two chunks a run: well past the burst and its refill
    for (let k = 1; k <= runs; k++) {
      const r = await api(c.ctl.port, c.op, 'PATCH', `/v1/deployments/${id}`, { input_values: { k: String(k) } });
      expect(r.status).toBe(200);
      d = await waitDeployment(c, id, undefined, 15_000, r.json.revision);
      expect(d.status).toBe('COMPLETE');
    }
    // every run's last chunks reached the controller before its signal (a signalled revision
    // takes no more), sent without waiting for the agent's pacer and not counted by the limit
    for (let k = 0; k <= runs; k++) {
      const kept = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output?revision=${d.revision - runs + k}`);
      expect([kept.json.stdout.text, kept.json.stderr.text]).toEqual([`run ${k}\n`, `warn ${k}\n`]);
    }
    expect(await refused()).toBe(before);
  });

  it('herald deploy logs --follow prints the lines as they come and exits 0, or 1 when the deployment FAILED', async () => {
    const stamp = path.join(c.work, 'cli-last-line-at');
    const ok = await mkConfig(c, {
      name: 'steps',
      group: 'script',
      config: `#!/bin/sh\nsleep 0.5\nfor i in 1 2 3 4 5 6 7 8 9 10; do\n  [ $i -eq 10 ] && date +%s%3N > ${stamp}\n  echo "step $i"\n  sleep 0.1\ndone\n`,
    });
    const id = await mkDeployment(c, { node: 'n1', config_id: ok, action: 'CREATE' });
    const r = await followLogs(id);
    expect(r.code).toBe(0);
    expect(r.out).toBe(Array.from({ length: 10 }, (_, i) => `step ${i + 1}\n`).join(''));
    expect(r.firstOutAt).toBeLessThan(Number(fs.readFileSync(stamp, 'utf8')));

    const bad = await mkConfig(c, {
      name: 'breaks',
      group: 'script',
      config: '#!/bin/sh\necho "about to break" >&2\nsleep 0.5\nexit 3\n',
    });
    const id2 = await mkDeployment(c, { node: 'n1', config_id: bad, action: 'CREATE' });
    const r2 = await followLogs(id2);
    expect(r2.code).toBe(1);
    expect(r2.err).toContain('about to break\n');
  });

  it('keeps the last 1 MiB of 50 MiB printed, and the agent stays small', async () => {
    const pid = n1.proc.child.pid!;
    const baseKb = rssKb(pid);
    const cfg = await mkConfig(c, {
      name: 'flood',
      group: 'script',
      config:
        '#!/bin/sh\nyes "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde" | head -c 52428800\necho END-OF-FLOOD\n',
    });
    const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
    let peakKb = 0;
    const sample = setInterval(() => {
      peakKb = Math.max(peakKb, rssKb(pid));
    }, 20);
    let d: { status: string; output_values: Record<string, unknown> };
    try {
      d = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 60_000);
    } finally {
      clearInterval(sample);
    }
    expect(d.status).toBe('COMPLETE');
    const kept = await waitFor('the last chunk kept', async () => {
      const r = await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}/output`);
      return String(r.json?.stdout?.text ?? '').endsWith('END-OF-FLOOD\n') ? r.json : null;
    });
    const text: string = kept.stdout.text;
    expect(text).toMatch(/^\[herald: \d+ bytes cut\]\n/);
    // the kept chunks' text, without the lines that say where output is missing
    const body = text.replace(/\[herald: \d+ bytes (cut|of output not streamed)\]\n/g, '');
    expect(Buffer.byteLength(body)).toBeLessThanOrEqual(1024 * 1024);
    expect(Buffer.byteLength(body)).toBeGreaterThan(1000 * 1024);
    // the agent read 50 MiB through its pipes; it holds at most its tail buffers and a bounded queue.
    // Reading 50 MiB through the pipes alone raises the RSS by about 40 MiB (buffers the GC has not
    // collected yet); a queue that kept what the controller could not take would add 50 MiB more.
    expect(baseKb).toBeGreaterThan(0);
    expect(peakKb - baseKb).toBeLessThan(80 * 1024);
  });

  it('loses no final result when the controller is down while the hook runs (the outbox delivers the signal)', async () => {
    const done = path.join(c.work, 'down-done');
    const cfg = await mkConfig(c, {
      name: 'while-down',
      group: 'script',
      config: `#!/bin/sh\ni=1\nwhile [ $i -le 20 ]; do echo "tick $i"; i=$((i+1)); sleep 0.1; done\ntouch ${done}\n`,
    });
    const ev = readEvents(c.ctl.port, c.op);
    await ev.opened;
    const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
    await waitFor('the first chunk', () => outputOf(ev.events, id).length > 0, 10_000);
    ev.close();
    await stopProc(c.ctl.proc);
    await waitFor('the hook to finish with the controller down', () => fs.existsSync(done), 15_000);
    await c.startController();
    const d = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 30_000);
    expect(d.status).toBe('COMPLETE');
    expect(d.output_values.deploy_stdout).toBe(Array.from({ length: 20 }, (_, i) => `tick ${i + 1}\n`).join(''));
  });
});

/** Runs `herald deploy logs <id> --follow` to its end. */
function followLogs(id: string): Promise<{ code: number | null; out: string; err: string; firstOutAt: number }> {
  const child = spawn(
    process.execPath,
    [HERALD, 'deploy', 'logs', id, '--follow', '--controller', `https://127.0.0.1:${c.ctl.port}`, '--pki', c.pki],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  let firstOutAt = Number.POSITIVE_INFINITY;
  child.stdout.on('data', (b: Buffer) => {
    firstOutAt = Math.min(firstOutAt, Date.now());
    out += b.toString();
  });
  child.stderr.on('data', (b: Buffer) => {
    err += b.toString();
  });
  return new Promise((resolve) => child.once('close', (code) => resolve({ code, out, err, firstOutAt })));
}

/** Resident set size of `pid`, KiB (0 when unknown). */
function rssKb(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}
