/**
 * The one-transaction shortcuts of `Store`, written once over `transaction()` and `getNode()`:
 * each runs one StoreTx call in its own transaction and reads the record after the commit.
 * SqliteStore and PgStore extend it.
 */
import type {
  AnnounceResult,
  ChangeSet,
  ConfigRecord,
  DeploymentPatch,
  DeploymentRecord,
  NewConfig,
  NewDeployment,
  NodeRecord,
} from './records.js';
import type { Committed, TxFn } from './store.js';

export abstract class StoreShortcuts {
  abstract transaction<T>(fn: TxFn<T>): Promise<Committed<T>>;
  abstract getNode(id: string): Promise<NodeRecord | undefined>;

  async createNode(
    id: string,
    endpoint: string | null,
    who: string,
  ): Promise<{ node: NodeRecord; changes: ChangeSet }> {
    const { changes } = await this.transaction((tx) => tx.createNode(id, endpoint, who));
    return { node: (await this.getNode(id))!, changes };
  }

  async announceEndpoint(id: string, url: string, who: string, autoRegister: boolean): Promise<AnnounceResult> {
    const { result, changes } = await this.transaction((tx) => tx.announceEndpoint(id, url, who, autoRegister));
    return { node: (await this.getNode(id))!, ...result, changes };
  }

  async deleteNode(id: string, who: string): Promise<ChangeSet> {
    return (await this.transaction((tx) => tx.deleteNode(id, who))).changes;
  }

  async createConfig(c: NewConfig, who: string): Promise<ConfigRecord> {
    return (await this.transaction((tx) => tx.createConfig(c, who))).result;
  }

  async createDeployment(d: NewDeployment, who: string): Promise<{ deployment: DeploymentRecord; changes: ChangeSet }> {
    const { result, changes } = await this.transaction((tx) => tx.createDeployment(d, who));
    return { deployment: result, changes };
  }

  async updateDeployment(
    id: string,
    p: DeploymentPatch,
    who: string,
  ): Promise<{ deployment: DeploymentRecord; changes: ChangeSet }> {
    const { result, changes } = await this.transaction((tx) => tx.updateDeployment(id, p, who));
    return { deployment: result, changes };
  }

  async deleteDeployment(
    id: string,
    who: string,
  ): Promise<{ deployment: DeploymentRecord | null; changes: ChangeSet }> {
    const { result, changes } = await this.transaction((tx) => tx.deleteDeployment(id, who));
    return { deployment: result, changes };
  }
}
