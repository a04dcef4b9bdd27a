/**
 * What an operator's long-lived reads show (docs/access.md): the event stream passes an event
 * only when the operator may read the node (or cluster) it is about, and `/metrics` drops the
 * series that name a node they may not read.
 *
 * A stream holds its operator's read scope and every node's facts (labels, cluster, group), read
 * when it opens and again every ACCESS_STREAM_REFRESH_MS, and at once when a grant changes through
 * this controller; in between, the node and cluster events it sees keep the facts current (a
 * relabelled node, a new cluster's members). When the operator no longer holds read at all,
 * `onLost` is called (the API ends the stream). A removed deployment's event names its node; a
 * removed cluster's does not, so it passes when the stream showed that cluster before.
 */
import { ACCESS_STREAM_SEEN_ENTRIES } from '../../protocol/limits.js';
import type { NodeFacts } from '../model/records.js';
import type { Store } from '../store/store.js';
import type { AccessControl } from './access.js';
import { unknownNode, VerbScope } from './policy.js';

/** One event as the bus publishes it (controller/service/events.ts). */
export interface ScopedEvent {
  type: string;
  data: Record<string, unknown>;
}

export interface StreamScopeOptions {
  access: AccessControl;
  store: Store;
  /** The operator's name (`operator/<name>`). */
  operator: string;
  /** Called once when a refresh finds that the operator no longer holds read. */
  onLost: () => void;
}

export class StreamScope {
  readonly #o: StreamScopeOptions;
  #scope: VerbScope | undefined;
  #facts = new Map<string, NodeFacts>();
  /** Clusters shown, oldest first (bounded): their removal is shown too. */
  readonly #seenClusters = new Map<string, true>();
  #lost = false;
  #refreshing: Promise<void> | undefined;

  constructor(o: StreamScopeOptions) {
    this.#o = o;
  }

  /** Reads the grants (and, for a scoped reader, every node's facts) again. Never rejects. */
  refresh(): Promise<void> {
    this.#refreshing ??= this.#refresh()
      .catch(() => undefined) // the last scope stays; the next refresh tries again
      .finally(() => {
        this.#refreshing = undefined;
      });
    return this.#refreshing;
  }

  async #refresh(): Promise<void> {
    const scope = new VerbScope('read', await this.#o.access.grantsOf(this.#o.operator));
    const facts = scope.held && !scope.all ? await this.#o.store.nodeFacts(null) : new Map<string, NodeFacts>();
    this.#scope = scope;
    this.#facts = facts;
    if (!scope.held && !this.#lost) {
      this.#lost = true;
      this.#o.onLost();
    }
  }

  /** Whether the event may be shown; node and cluster events also update the facts. */
  allows(e: ScopedEvent): boolean {
    const scope = this.#scope;
    if (scope === undefined || !scope.held) return false;
    const d = e.data;
    if (scope.all) return true;
    switch (e.type) {
      case 'node': {
        const id = str(d.id);
        if (id === undefined) return false;
        if (d.deleted === true) {
          const shown = scope.node(this.#facts.get(id) ?? unknownNode(id));
          this.#facts.delete(id);
          return shown;
        }
        const had = this.#facts.get(id);
        const labels = isLabels(d.labels) ? d.labels : (had?.labels ?? {});
        const f: NodeFacts = { id, labels, cluster: had?.cluster ?? null };
        this.#facts.set(id, f);
        return scope.node(f);
      }
      case 'cluster':
        return this.#cluster(scope, d);
      default: {
        // deployment, push, output: each names its node (a removed deployment too)
        const node = str(d.node);
        return node !== undefined && scope.node(this.#facts.get(node) ?? unknownNode(node));
      }
    }
  }

  #cluster(scope: VerbScope, d: Record<string, unknown>): boolean {
    const id = str(d.id);
    if (id === undefined) return false;
    if (d.deleted === true) {
      for (const f of this.#facts.values()) if (f.cluster?.id === id) f.cluster = null;
      const shown = this.#seenClusters.delete(id);
      return shown;
    }
    const name = str(d.name) ?? '';
    const members: NodeFacts[] = [];
    for (const m of Array.isArray(d.nodes) ? (d.nodes as unknown[]) : []) {
      const node = str((m as Record<string, unknown> | null)?.node);
      if (node === undefined) continue;
      const nodegroup = str((m as Record<string, unknown>).nodegroup) ?? '';
      const f: NodeFacts = {
        id: node,
        labels: this.#facts.get(node)?.labels ?? {},
        cluster: { id, name, nodegroup },
      };
      this.#facts.set(node, f);
      members.push(f);
    }
    const shown = scope.cluster({ id, name, members });
    if (shown) {
      this.#seenClusters.delete(id);
      this.#seenClusters.set(id, true);
      if (this.#seenClusters.size > ACCESS_STREAM_SEEN_ENTRIES)
        this.#seenClusters.delete(this.#seenClusters.keys().next().value!);
    }
    return shown;
  }
}

function str(v: unknown): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

function isLabels(v: unknown): v is Record<string, string> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * The Prometheus text without the samples whose `node` label names a node `visible` refuses
 * (HELP and TYPE lines stay).
 */
export function filterMetricsText(text: string, visible: (node: string) => boolean): string {
  const out: string[] = [];
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || !line.includes('node="')) {
      out.push(line);
      continue;
    }
    const node = nodeLabelOf(line);
    if (node === undefined || visible(node)) out.push(line);
  }
  return out.join('\n');
}

/** The value of the `node` label of one sample line (the exposition format's escapes read), if it has one. */
function nodeLabelOf(line: string): string | undefined {
  const open = line.indexOf('{');
  if (open < 0) return undefined;
  const re = /([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/y;
  re.lastIndex = open + 1;
  for (;;) {
    const m = re.exec(line);
    if (!m) return undefined;
    if (m[1] === 'node') return m[2]!.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
    if (line[re.lastIndex] !== ',') return undefined;
    re.lastIndex++;
  }
}
