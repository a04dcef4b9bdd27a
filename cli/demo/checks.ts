/**
 * What the demo's restart promises, checked on every node afterwards: the application container
 * still runs (same pid), the volume's files are the same, the service was replaced by a new
 * running process, and the scripts ran uninstall then install.
 */
import fs from 'node:fs';
import path from 'node:path';
import { hashDir, readPid, type DemoNode } from './fixtures.js';
import { isAlive } from './supervisor.js';

export interface NodeChecks {
  /** One table row per node: NODE, CONTAINER PID, VOLUME FILES, SERVICE PID, SCRIPTS. */
  rows: string[][];
  /** One line per check that did not hold; empty when all did. */
  failures: string[];
}

const mark = (ok: boolean): string => (ok ? '✓' : '✗');

/** Checks every node; records each node's new service pid in `servicePid` (for cleanup). */
export function checkNodes(nodes: DemoNode[]): NodeChecks {
  const failures: string[] = [];
  const rows = nodes.map((n) => {
    const containerOk = !n.containerExited && isAlive(n.containerPid);
    const volumeOk = hashDir(n.volume) === n.volumeHash;
    const oldPid = n.servicePid;
    const newPid = readPid(path.join(n.dir, 'service.pid'));
    const serviceOk = newPid !== undefined && newPid !== oldPid && isAlive(newPid) && !isAlive(oldPid);
    const runs = fs.readFileSync(path.join(n.dir, 'runs.log'), 'utf8').trim().split('\n');
    const orderOk = runs.slice(-2).join(',') === 'uninstall RESTART,install RESTART';
    if (!containerOk) failures.push(`${n.id}: the application container (pid ${n.containerPid}) is gone`);
    if (!volumeOk) failures.push(`${n.id}: the volume's files changed`);
    if (!serviceOk)
      failures.push(
        `${n.id}: the service pid did not change to a new running process (${oldPid ?? '-'} → ${newPid ?? '-'})`,
      );
    if (!orderOk) failures.push(`${n.id}: the scripts did not run uninstall then install (${runs.join(', ')})`);
    n.servicePid = newPid;
    return [
      n.id,
      `${n.containerPid} same ${mark(containerOk)}`,
      `same ${mark(volumeOk)}`,
      `${oldPid ?? '-'} → ${newPid ?? '-'} changed ${mark(serviceOk)}`,
      `${runs
        .slice(-2)
        .map((r) => r.split(' ')[0])
        .join(' → ')} ${mark(orderOk)}`,
    ];
  });
  return { rows, failures };
}
