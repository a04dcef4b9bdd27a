/**
 * Heat's rule for which deployments a node's metadata document carries.
 */

/**
 * Whether a deployment at revision `revision`, whose action is `action`, has an item in its node's
 * document: not one born not triggered (its first revision's action outside its `actions`, say a
 * deployment made with CREATE whose actions list only DELETE) until its next revision. Heat creates no deployment for an
 * action outside `actions` (`SoftwareDeployment._handle_action` returns first; Heat then waits for
 * a revision that runs, Herald shows the next one, run or not: the agent skips a `signalled` item
 * either way, and a deployment that has run keeps its item through revisions that run nothing).
 * What runs is decided from `actions` for every group, as the store decides it (docs/api.md). (A
 * cluster makes none such: a node's uninstall deployment is made by its first uninstall, with
 * that step's revision.) `actionsJson` is the deployment's stored `actions` (a JSON array).
 */
export function inDocument(revision: number, action: string, actionsJson: string): boolean {
  return revision > 1 || (JSON.parse(actionsJson) as string[]).includes(action);
}

/**
 * Generations whose document a metadata read need not return: the asker holds it, or the
 * controller has built it already; `all`: none is needed (an `If-None-Match: *`).
 */
export type KnownGenerations = readonly number[] | 'all';

/** Whether `generation` is among `known`. */
export function knows(known: KnownGenerations, generation: number): boolean {
  return known === 'all' || known.includes(generation);
}
