/**
 * A node behind NAT for tests: a network namespace joined to this host by a veth pair, whose
 * inbound connections are dropped (the namespace's own firewall drops every TCP SYN arriving: a
 * connection attempt into it), while connections it opens itself work, as behind a NAT or a
 * firewall that allows only outbound traffic. A connection can also be blackholed (every packet
 * of one local port dropped both ways, no RST), as when a NAT mapping silently expires. Needs
 * root, `ip` (iproute2) and `iptables` (Debian's package; `.ci/run` installs it);
 * `netnsAvailable()` says whether this machine can.
 *
 *   const ns = await makeNetns();          // host end 10.211.N.1, namespace end 10.211.N.2
 *   spawn('ip', ['netns', 'exec', ns.name, 'node', ...]);
 *   ns.blackhole(44321);                   // drop the connection whose namespace port is 44321
 *   ns.remove();
 */
import { spawnSync } from 'node:child_process';
import crypto from 'node:crypto';

export interface Netns {
  readonly name: string;
  /** The host's address on the link: what a process in the namespace dials to reach the host. */
  readonly hostIp: string;
  /** The namespace's address. */
  readonly nsIp: string;
  /** The argv prefix that runs a command inside the namespace. */
  readonly exec: string[];
  /** Drops, silently, every packet to and from the namespace's local TCP port `port` (one connection's). */
  blackhole(port: number): void;
  /** Undoes every blackhole. */
  restore(): void;
  /** Removes the namespace and the link. Idempotent. */
  remove(): void;
}

function run(args: string[], check = true): { status: number | null; out: string } {
  const r = spawnSync(args[0]!, args.slice(1), { encoding: 'utf8' });
  const out = `${r.stdout ?? ''}${r.stderr ?? ''}`;
  if (check && r.status !== 0) throw new Error(`${args.join(' ')} → ${r.status}: ${out}`);
  return { status: r.status, out };
}

let available: boolean | undefined;

/** Can this machine make namespaces with a firewall of their own (root, iproute2, iptables)? */
export function netnsAvailable(): boolean {
  if (available === undefined) {
    const name = `hn-probe-${process.pid}`;
    available =
      process.getuid?.() === 0 &&
      run(['ip', 'netns', 'add', name], false).status === 0 &&
      run(['ip', 'netns', 'exec', name, 'iptables', '-A', 'INPUT', '-p', 'tcp', '--syn', '-j', 'DROP'], false)
        .status === 0;
    run(['ip', 'netns', 'del', name], false);
  }
  return available;
}

let next = 0;

/** A namespace that can dial the host and that nothing can dial. */
export function makeNetns(): Netns {
  const tag = `${process.pid % 10_000}${next++}${crypto.randomBytes(1).toString('hex')}`.slice(-6);
  const name = `hn-${tag}`;
  const host = `hv${tag}`;
  const peer = `nv${tag}`;
  const subnet = 16 + ((process.pid * 7 + next * 13) % 200);
  const hostIp = `10.211.${subnet}.1`;
  const nsIp = `10.211.${subnet}.2`;
  const blackholed = new Set<number>();
  run(['ip', 'netns', 'add', name]);
  try {
    run(['ip', 'link', 'add', host, 'type', 'veth', 'peer', 'name', peer]);
    run(['ip', 'link', 'set', peer, 'netns', name]);
    run(['ip', 'addr', 'add', `${hostIp}/30`, 'dev', host]);
    run(['ip', 'link', 'set', host, 'up']);
    run(['ip', 'netns', 'exec', name, 'ip', 'addr', 'add', `${nsIp}/30`, 'dev', peer]);
    run(['ip', 'netns', 'exec', name, 'ip', 'link', 'set', peer, 'up']);
    run(['ip', 'netns', 'exec', name, 'ip', 'link', 'set', 'lo', 'up']);
    // connection attempts into the namespace are dropped; what it opens itself is answered
    run(['ip', 'netns', 'exec', name, 'iptables', '-A', 'INPUT', '-p', 'tcp', '--syn', '-j', 'DROP']);
  } catch (e) {
    run(['ip', 'netns', 'del', name], false);
    run(['ip', 'link', 'del', host], false);
    throw e;
  }
  let removed = false;
  const ipt = (op: '-I' | '-D', chain: 'INPUT' | 'OUTPUT', dir: '--dport' | '--sport', port: number, check = true) =>
    run(['ip', 'netns', 'exec', name, 'iptables', op, chain, '-p', 'tcp', dir, String(port), '-j', 'DROP'], check);
  return {
    name,
    hostIp,
    nsIp,
    exec: ['ip', 'netns', 'exec', name],
    blackhole(port) {
      if (blackholed.has(port)) return;
      blackholed.add(port);
      ipt('-I', 'OUTPUT', '--sport', port);
      ipt('-I', 'INPUT', '--dport', port);
    },
    restore() {
      for (const port of blackholed) {
        ipt('-D', 'OUTPUT', '--sport', port, false);
        ipt('-D', 'INPUT', '--dport', port, false);
      }
      blackholed.clear();
    },
    remove() {
      if (removed) return;
      removed = true;
      run(['ip', 'netns', 'del', name], false);
      run(['ip', 'link', 'del', host], false);
    },
  };
}
