/**
 * What one transaction changed, gathered as it runs: nodes whose metadata changed (and which of
 * them got work), and the records to announce. Built only through these methods; the store
 * turns it into a `ChangeSet` once, after it gave the touched nodes their new generation.
 */
import type { WakeReason } from '../../protocol/wake.js';
import type { ChangeSet } from './records.js';

export function emptyChanges(): ChangeSet {
  return {
    generation: null,
    touchedNodes: [],
    wakes: [],
    endpoints: [],
    nodes: [],
    removedNodes: [],
    deployments: [],
    removedDeployments: [],
    clusters: [],
    removedClusters: [],
  };
}

/**
 * One transaction's changes. Each list keeps first-noted order and holds an id once (a Set, so
 * noting stays O(1): a 10,000-node cluster notes 20,000 deployments); an id noted as removed
 * leaves its "changed" list and is not noted as changed again.
 */
export class ChangeSetBuilder {
  /** Node → the wake reason when it got work, null when only its metadata changed. */
  readonly #touched = new Map<string, WakeReason | null>();
  readonly #nodes = new Set<string>();
  /** Node → its endpoint now, for nodes created or whose endpoint changed. */
  readonly #endpoints = new Map<string, string | null>();
  readonly #removedNodes = new Set<string>();
  readonly #deployments = new Set<string>();
  readonly #removedDeployments = new Set<string>();
  /** The node of each removed deployment, when known: the event stream shows a removal only to those who may see that node. */
  readonly #removedDeploymentNodes = new Map<string, string>();
  readonly #clusters = new Set<string>();
  readonly #removedClusters = new Set<string>();

  /** The node's metadata changed; `reason` when it also has work (a wake-up). A reason once given stays. */
  touch(node: string, reason: WakeReason | null = null): void {
    const had = this.#touched.get(node);
    this.#touched.set(node, had ?? reason);
  }

  /** The node's record changed (its endpoint, say) without a metadata change. */
  nodeChanged(id: string): void {
    if (!this.#removedNodes.has(id)) this.#nodes.add(id);
  }

  /** The node was created, or its endpoint changed: `url` is its endpoint now (null: none). */
  endpointSet(id: string, url: string | null): void {
    this.#endpoints.set(id, url);
  }

  /** The node was deleted: touched (its generation moves on in the sequence), never woken. */
  nodeRemoved(id: string): void {
    this.touch(id);
    this.#nodes.delete(id);
    this.#endpoints.delete(id);
    this.#removedNodes.add(id);
  }

  deploymentChanged(id: string): void {
    if (!this.#removedDeployments.has(id)) this.#deployments.add(id);
  }

  deploymentRemoved(id: string, node?: string): void {
    this.#deployments.delete(id);
    this.#removedDeployments.add(id);
    if (node !== undefined) this.#removedDeploymentNodes.set(id, node);
  }

  clusterChanged(id: string): void {
    if (!this.#removedClusters.has(id)) this.#clusters.add(id);
  }

  clusterRemoved(id: string): void {
    this.#clusters.delete(id);
    this.#removedClusters.add(id);
  }

  /** Nothing was noted: nothing to stamp, announce or log. */
  get isEmpty(): boolean {
    return (
      this.#touched.size === 0 &&
      this.#nodes.size === 0 &&
      this.#endpoints.size === 0 &&
      this.#removedNodes.size === 0 &&
      this.#deployments.size === 0 &&
      this.#removedDeployments.size === 0 &&
      this.#clusters.size === 0 &&
      this.#removedClusters.size === 0
    );
  }

  /** Some node's metadata changed: the transaction must take a new generation. */
  get needsGeneration(): boolean {
    return this.#touched.size > 0;
  }

  /** The touched nodes that still exist: the store gives each the new generation. */
  *nodesToStamp(): IterableIterator<string> {
    for (const node of this.#touched.keys()) if (!this.#removedNodes.has(node)) yield node;
  }

  /**
   * The change set, given the transaction's new sequence value (null when no node was
   * touched). Touched nodes that still exist are announced, those with work woken.
   */
  build(generation: number | null): ChangeSet {
    const c = emptyChanges();
    c.generation = generation;
    const nodes = new Set(this.#nodes);
    if (generation !== null) {
      for (const [node, reason] of this.#touched) {
        c.touchedNodes.push(node);
        if (this.#removedNodes.has(node)) continue;
        if (reason !== null) c.wakes.push({ node, generation, reason });
        nodes.add(node);
      }
    }
    c.endpoints = [...this.#endpoints];
    c.nodes = [...nodes];
    c.removedNodes = [...this.#removedNodes];
    c.deployments = [...this.#deployments];
    c.removedDeployments = [...this.#removedDeployments];
    if (this.#removedDeploymentNodes.size > 0)
      c.removedDeploymentNodes = Object.fromEntries(this.#removedDeploymentNodes);
    c.clusters = [...this.#clusters];
    c.removedClusters = [...this.#removedClusters];
    return c;
  }
}
