/**
 * Whom a TLS dialer accepts as the server (certs/tls.ts `tlsClientOptions`, and the agent's
 * session store, certs/session-store.ts): its own module so both can use it without importing
 * each other.
 */
import { acceptsController, describeControllerIds, type ControllerIds, type Role } from '../protocol/identity.js';

/**
 * Whom a dialer accepts as the server: exactly one SPIFFE id, or any of a set of controllers of
 * the trust domain (the agent's `--controller-id`, docs/several-controllers.md).
 */
export type ExpectedServer = string | { readonly controllers: ControllerIds };

/** Whether the verified identity `id` is the server `expected`. */
export function isExpectedServer(
  expected: ExpectedServer,
  id: { spiffeId: string; role: Role; name: string },
): boolean {
  if (typeof expected === 'string') return id.spiffeId === expected;
  return id.role === 'controller' && acceptsController(expected.controllers, id.name);
}

/** `expected` for a message. */
export function describeExpectedServer(expected: ExpectedServer): string {
  return typeof expected === 'string' ? expected : describeControllerIds(expected.controllers);
}
