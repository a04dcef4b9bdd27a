/**
 * End to end: the controller and agents are separate
 * `bin/herald` processes on 127.0.0.1 with a PKI made by `bin/herald certs`. Needs
 * `npm run build` first (`npm test` does it).
 */
import { readProcStat } from '../helpers/procs.js';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, heraldSync, isBuilt, killAll, stopProc, waitFor } from '../helpers/procs.js';
import {
  getDeployment,
  getNode,
  makeCluster,
  mkConfig,
  mkDeployment,
  waitDeployment,
  type AgentProc,
  type Cluster,
} from '../helpers/agent-cluster.js';

const built = isBuilt();
let c: Cluster;
let n1: AgentProc;

beforeAll(async () => {
  if (!built) return;
  c = await makeCluster(['n1', 'n2', 'n3', 'n4', 'n5', 'n6']);
  n1 = await c.startAgent('n1');
}, 90_000);

afterAll(async () => {
  await killAll();
  c?.cleanup();
});

/** A process's state letter from /proc (Z: zombie), or null when it is gone. */
function procState(pid: number): string | null {
  return readProcStat(pid)?.state ?? null;
}

/** Is any process of group `pgid` still running (not a zombie)? */
function groupAlive(pgid: number): boolean {
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const s = readProcStat(Number(d));
    if (s && s.pgrp === pgid && s.state !== 'Z') return true;
  }
  return false;
}

describe.skipIf(!built)('agent end to end', { timeout: 90_000 }, () => {
  it('refuses to start, in one line naming the option, when the certificate is not agent/<--node>', () => {
    const r = heraldSync([
      'agent',
      '--node',
      'n2',
      '--controller',
      `https://127.0.0.1:${c.ctl.port}`,
      '--listen',
      '127.0.0.1:0',
      '--pki',
      c.pki,
      '--state-dir',
      path.join(c.work, 'state-refused'),
      '--cert',
      path.join(c.pki, 'agent', 'n1.crt'),
      '--key',
      path.join(c.pki, 'agent', 'n1.key'),
    ]);
    expect(r.code).toBe(1);
    const lines = r.err.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain('--node n2');
    expect(lines[0]).toContain('agent/n1');
  });

  it('warns at start when the agent can read the CA key or the signing key (it runs from the whole PKI dir here)', async () => {
    await waitFor(
      'the warning in the agent log',
      () => n1.proc.log().includes('can read a CA or controller secret'),
      10_000,
    );
    const warned = n1.proc
      .log()
      .split('\n')
      .filter((l) => l.includes('can read a CA or controller secret'))
      .map((l) => (JSON.parse(l) as { file: string }).file);
    expect(warned.map((f) => path.basename(f)).sort()).toEqual(['ca.key', 'wake-signing.jwk']);
  });

  it('runs a script deployment the controller pushed: COMPLETE with its outputs, the agent woken for it', async () => {
    const started = path.join(c.work, 'hello.started');
    const cfg = await mkConfig(c, {
      name: 'hello',
      group: 'script',
      config: `#!/bin/sh\ndate +%s%3N > ${started}\necho "hi $greeting"\nprintf done > "$heat_outputs_path.result"\n`,
      inputs: [{ name: 'greeting', type: 'String' }],
      outputs: [{ name: 'result' }],
    });
    const logged = n1.proc.log().length;
    const id = await mkDeployment(c, {
      node: 'n1',
      config_id: cfg,
      action: 'CREATE',
      input_values: { greeting: 'world' },
    });
    const d = await waitDeployment(c, id);
    expect(d.status, d.status_reason).toBe('COMPLETE');
    expect(d.output_values).toMatchObject({ result: 'done', deploy_status_code: 0 });
    expect(d.output_values.deploy_stdout).toContain('hi world');
    expect(fs.existsSync(started)).toBe(true);
    // pushed, not polled: the agent (polling every 600 s while push is healthy) was woken for it; the
    // wake-up starts a fetch, or joins one still in flight (on a loaded CI machine, the start-up one)
    const since = n1.proc
      .log()
      .slice(logged)
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { msg: string; reason?: string; fetch?: string });
    expect(
      since.some(
        (l) => l.msg === 'wake-up' && l.reason === 'deployment' && (l.fetch === 'started' || l.fetch === 'queued'),
      ),
    ).toBe(true);
  });

  it('a script exiting 3 is FAILED with deploy_status_code 3 and its stderr kept', async () => {
    const cfg = await mkConfig(c, { name: 'bad', group: 'script', config: '#!/bin/sh\necho oops >&2\nexit 3\n' });
    const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
    const d = await waitDeployment(c, id);
    expect(d.status).toBe('FAILED');
    expect(d.output_values.deploy_status_code).toBe(3);
    expect(d.output_values.deploy_stderr).toContain('oops');
  });

  it('a component config runs the CREATE script on create and the DELETE script on delete', async () => {
    const marker = path.join(c.work, 'component.log');
    const cfg = await mkConfig(c, {
      name: 'comp',
      group: 'component',
      config: {
        configs: [
          {
            actions: ['CREATE', 'UPDATE'],
            tool: 'script',
            config: `#!/bin/sh\necho "create $deploy_action" >> ${marker}\n`,
          },
          { actions: ['DELETE'], tool: 'script', config: `#!/bin/sh\necho "delete $deploy_action" >> ${marker}\n` },
        ],
      },
    });
    const id = await mkDeployment(c, {
      node: 'n1',
      config_id: cfg,
      action: 'CREATE',
      actions: ['CREATE', 'UPDATE', 'DELETE'],
    });
    expect((await waitDeployment(c, id)).status).toBe('COMPLETE');
    expect(fs.readFileSync(marker, 'utf8')).toBe('create CREATE\n');
    const del = await api(c.ctl.port, c.op, 'DELETE', `/v1/deployments/${id}`);
    expect(del.status).toBeLessThan(300);
    await waitFor(
      'the deployment to be removed after its DELETE ran',
      async () => (await getDeployment(c, id)).status === 404,
    );
    expect(fs.readFileSync(marker, 'utf8')).toBe('create CREATE\ndelete DELETE\n');
  });

  it('a group "ansible" hook in --hooks-dir speaking Heat\'s protocol: COMPLETE with its outputs', async () => {
    const seen = path.join(c.work, 'ansible-stdin.json');
    fs.writeFileSync(
      path.join(n1.hooks, 'ansible'),
      `#!/bin/sh\ncat > ${seen}\n` +
        'echo \'{"deploy_stdout":"PLAY RECAP ok=1","deploy_stderr":"","deploy_status_code":0,"ansible_result":"converged"}\'\n',
      { mode: 0o755 },
    );
    const cfg = await mkConfig(c, {
      name: 'play',
      group: 'ansible',
      config: '- hosts: localhost\n  tasks: []\n',
      outputs: [{ name: 'ansible_result' }],
    });
    const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
    const d = await waitDeployment(c, id);
    expect(d.status, d.status_reason).toBe('COMPLETE');
    expect(d.output_values).toMatchObject({
      ansible_result: 'converged',
      deploy_stdout: 'PLAY RECAP ok=1',
      deploy_status_code: 0,
    });
    const item = JSON.parse(fs.readFileSync(seen, 'utf8')) as {
      id: string;
      group: string;
      config: string;
      inputs: Array<{ name: string }>;
    };
    expect(item.group).toBe('ansible');
    expect(item.config).toContain('hosts: localhost');
    expect(item.inputs.some((i) => i.name === 'deploy_action')).toBe(true);
  });

  it('with push cut, --poll-interval 2s applies a change by polling; the node shows the push failure', async () => {
    const a = await c.startAgent('n2', ['--poll-interval', '2s', '--poll-interval-healthy', '2s']);
    // a silent listener: accepts TCP, never speaks TLS
    const sink = net.createServer((s) => s.on('error', () => undefined));
    await new Promise<void>((r) => sink.listen(0, '127.0.0.1', () => r()));
    const deadUrl = `wss://127.0.0.1:${(sink.address() as net.AddressInfo).port}/v1/wake`;
    try {
      await waitFor(
        'the cut endpoint to be accepted',
        async () => (await api(c.ctl.port, a.cred, 'PUT', '/v1/nodes/n2/endpoint', { url: deadUrl })).status === 200,
        10_000,
        250,
      );
      // the push connection made before the cut may still carry a ping as it closes: wait until the
      // agent holds none (each "controller connected" of its log has its "controller disconnected")
      await waitFor(
        'the push connection held before the cut to close',
        () => {
          const log = a.proc.log();
          return (
            log.split('"msg":"controller connected"').length === log.split('"msg":"controller disconnected"').length
          );
        },
        10_000,
        25,
      );
      const cfg = await mkConfig(c, { name: 'polled', group: 'script', config: '#!/bin/sh\necho polled\n' });
      const logged = a.proc.log().length;
      const t0 = Date.now();
      const id = await mkDeployment(c, { node: 'n2', config_id: cfg, action: 'CREATE' });
      const d = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 10_000);
      const ms = Date.now() - t0;
      expect(d.status).toBe('COMPLETE');
      // applied by a poll: no wake-up reached the agent after the cut
      expect(a.proc.log().slice(logged)).not.toContain('"msg":"wake-up"');
      const node = await waitFor(
        'the push failure to show',
        async () => {
          const n = await getNode(c, 'n2');
          if (n?.push?.connected === false && n.push.last_error) return n;
          // on a timeout the message carries what was seen, and the controller's lines for n2
          throw new Error(
            `after ${ms} ms to COMPLETE, push ${JSON.stringify(n?.push)}, endpoint ${String(n?.endpoint)}; controller: ${c.ctl.proc
              .log()
              .split('\n')
              .filter((l) => l.includes('"n2"') || /"level":[4-6]0/.test(l))
              .slice(-12)
              .join(' | ')}; agent: ${a.proc
              .log()
              .split('\n')
              .filter((l) => /announce|push|"level":[4-6]0/.test(l))
              .slice(-8)
              .join(' | ')}`,
          );
        },
        10_000,
        100,
      );
      expect(node.push.last_error).toBeTruthy();
    } finally {
      sink.close();
      await stopProc(a.proc);
    }
  });

  it("an agent SIGKILLed while a hook sleeps: FAILED interrupted after restart, the hook's group killed, a new revision runs", async () => {
    const pidFile = path.join(c.work, 'sleeper.pid');
    const cfg = await mkConfig(c, {
      name: 'sleeper',
      group: 'script',
      config: `#!/bin/sh\nif [ "$mode" = sleep ]; then echo $$ > ${pidFile}; sleep 60; fi\necho "mode $mode"\n`,
      inputs: [{ name: 'mode', type: 'String' }],
    });
    let a = await c.startAgent('n3');
    const id = await mkDeployment(c, { node: 'n3', config_id: cfg, action: 'CREATE', input_values: { mode: 'sleep' } });
    const pid = await waitFor('the hook to start', () =>
      fs.existsSync(pidFile) ? Number(fs.readFileSync(pidFile, 'utf8')) : 0,
    );
    await stopProc(a.proc, 'SIGKILL');
    expect(groupAlive(pid)).toBe(true); // the hook has its own process group: it outlived the agent
    a = await c.startAgent('n3', [], { port: a.port });
    const d = await waitDeployment(c, id);
    expect(d.status).toBe('FAILED');
    expect(d.status_reason).toContain('interrupted');
    await waitFor("the sleeping hook's process group to be gone", () => !groupAlive(pid), 5_000);
    expect(['Z', null]).toContain(procState(pid));
    const patched = await api(c.ctl.port, c.op, 'PATCH', `/v1/deployments/${id}`, { input_values: { mode: 'quick' } });
    expect(patched.status).toBe(200);
    const d2 = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 15_000, d.revision + 1);
    expect(d2.status).toBe('COMPLETE');
    expect(d2.output_values.deploy_stdout).toContain('mode quick');
    await stopProc(a.proc);
  });

  it('an agent whose state dir was wiped after its deployments finished runs nothing again', async () => {
    const counter = path.join(c.work, 'wipe-counter.log');
    const cfg = await mkConfig(c, {
      name: 'once',
      group: 'script',
      config: `#!/bin/sh\necho "$deploy_server_id ran" >> ${counter}\n`,
    });
    let a = await c.startAgent('n4');
    const ids = [
      await mkDeployment(c, { node: 'n4', config_id: cfg, action: 'CREATE', name: 'a-first' }),
      await mkDeployment(c, { node: 'n4', config_id: cfg, action: 'CREATE', name: 'b-second' }),
    ];
    for (const id of ids) expect((await waitDeployment(c, id)).status).toBe('COMPLETE');
    await stopProc(a.proc);
    fs.rmSync(a.state, { recursive: true, force: true });
    a = await c.startAgent('n4', [], { port: a.port });
    // a barrier sorted after both: once it ran, the agent has been through the whole list
    const barrier = await mkConfig(c, { name: 'barrier', group: 'script', config: '#!/bin/sh\necho barrier\n' });
    const b = await mkDeployment(c, { node: 'n4', config_id: barrier, action: 'CREATE', name: 'z-barrier' });
    expect((await waitDeployment(c, b)).status).toBe('COMPLETE');
    expect(fs.readFileSync(counter, 'utf8')).toBe('n4 ran\nn4 ran\n');
    await stopProc(a.proc);
  });

  it('SIGTERM lets a running hook finish, delivers its result, then exits 0', async () => {
    const pidFile = path.join(c.work, 'graceful.pid');
    const cfg = await mkConfig(c, {
      name: 'graceful',
      group: 'script',
      config: `#!/bin/sh\necho $$ > ${pidFile}\nsleep 1\necho graceful\n`,
    });
    const a = await c.startAgent('n6');
    const id = await mkDeployment(c, { node: 'n6', config_id: cfg, action: 'CREATE' });
    await waitFor('the hook to start', () => fs.existsSync(pidFile));
    const t0 = Date.now();
    await stopProc(a.proc, 'SIGTERM');
    expect(a.proc.child.exitCode).toBe(0);
    expect(Date.now() - t0).toBeLessThan(5_000);
    const d = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 5_000);
    expect(d.status).toBe('COMPLETE');
    expect(d.output_values.deploy_stdout).toContain('graceful');
  });

  it('the controller stopped while the agent finishes three deployments: all three results arrive after it returns, none twice', async () => {
    const gate = path.join(c.work, 'gate');
    const runs = path.join(c.work, 'outbox-runs.log');
    const cfg = await mkConfig(c, {
      name: 'gated',
      group: 'script',
      config: `#!/bin/sh\nwhile [ ! -f ${gate} ]; do sleep 0.02; done\necho "$deploy_resource_name $n" >> ${runs}\necho "result $n"\n`,
      inputs: [{ name: 'n', type: 'String' }],
    });
    const a = await c.startAgent('n5', ['--poll-interval', '2s']);
    const ids: string[] = [];
    for (const n of ['1', '2', '3'])
      ids.push(
        await mkDeployment(c, {
          node: 'n5',
          config_id: cfg,
          action: 'CREATE',
          name: `gated-${n}`,
          input_values: { n },
        }),
      );
    // the agent holds all three once it says so: the controller's generation_fetched is recorded
    // as the answer leaves, and a SIGKILL right after it could stop the answer on its way
    await waitFor(
      'the agent to fetch all three',
      () =>
        a.proc
          .log()
          .split('\n')
          .some((l) => l.includes('"metadata fetched"') && l.includes('"items":3')),
      10_000,
      25,
    );
    await stopProc(c.ctl.proc, 'SIGKILL');
    fs.writeFileSync(gate, '');
    await waitFor(
      'the three runs',
      () => fs.existsSync(runs) && fs.readFileSync(runs, 'utf8').trim().split('\n').length === 3,
      15_000,
    );
    await waitFor(
      'the three signals in the outbox',
      () => fs.readdirSync(path.join(a.state, 'outbox')).filter((f) => f.endsWith('.json')).length === 3,
      5_000,
    );
    await c.startController();
    for (const [i, id] of ids.entries()) {
      const d = await waitDeployment(c, id, ['COMPLETE', 'FAILED'], 30_000);
      expect(d.status).toBe('COMPLETE');
      expect(d.output_values.deploy_stdout).toContain(`result ${i + 1}`);
    }
    expect(fs.readFileSync(runs, 'utf8').trim().split('\n').sort()).toHaveLength(3);
    await waitFor(
      'the outbox to drain',
      () => fs.readdirSync(path.join(a.state, 'outbox')).filter((f) => f.endsWith('.json')).length === 0,
      10_000,
    );
    // the log line follows the outbox removal: wait for it rather than read a log mid-write
    const deliveredLines = () =>
      a.proc
        .log()
        .split('\n')
        .filter((l) => l.includes('"signal delivered"'));
    await waitFor('three delivered signals in the agent log', () => deliveredLines().length >= 3, 5_000);
    const delivered = deliveredLines();
    expect(delivered).toHaveLength(3);
    expect(new Set(delivered.map((l) => (JSON.parse(l) as { deployment_id: string }).deployment_id)).size).toBe(3);
  });
});
