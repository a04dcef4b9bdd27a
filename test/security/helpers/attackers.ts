/**
 * Attackers' certificates, each made by `certs/` (`makeCertificate`, `makeCa`), for the identity
 * they try to pass as. "Signed by the cluster CA" variants stand for certificates the CA really
 * issued for something else (another trust domain, another purpose, long ago); the foreign and
 * self-signed ones for certificates the attacker made alone.
 */
import { makeCa, makeCertificate, type MakeCertificateOptions, type Pem } from '../../../certs/pki.js';
import type { Role } from '../../../protocol/identity.js';
import { TD, type Battery, type Cred } from './battery.js';

const DAY_MS = 86_400_000;

export interface Made extends Cred {
  serial: string;
}

export class Attackers {
  readonly #b: Battery;
  #foreignCa: Pem | undefined;

  constructor(b: Battery) {
    this.#b = b;
  }

  #make(o: Partial<MakeCertificateOptions> & { uris: string[] }, role: Role): Made {
    const eku = role === 'operator' ? { clientAuth: true } : { serverAuth: true, clientAuth: true };
    const m = makeCertificate({
      issuer: this.#b.ca,
      dns: ['localhost'],
      ip: ['127.0.0.1'],
      eku,
      keyPem: this.#b.keyPem,
      ...o,
    });
    return { ca: this.#b.caBuf, cert: Buffer.from(m.cert), key: Buffer.from(m.key), serial: m.serial };
  }

  #uri(role: Role, name: string, td = TD): string {
    return `spiffe://${td}/${role}/${name}`;
  }

  /** The right URI and EKUs, signed by a CA the attacker made (same trust domain SAN). */
  foreign(role: Role, name: string): Made {
    this.#foreignCa ??= makeCa({ trustDomain: TD, keyPem: this.#b.keyPem, commonName: `Herald CA ${TD}` });
    return this.#make({ issuer: this.#foreignCa, uris: [this.#uri(role, name)] }, role);
  }

  /** Self-signed, claiming the identity. */
  forged(role: Role, name: string): Made {
    return this.#make({ issuer: 'self', uris: [this.#uri(role, name)] }, role);
  }

  /** Signed by the cluster CA, expired yesterday. */
  expired(role: Role, name: string): Made {
    const now = Date.now();
    return this.#make(
      { uris: [this.#uri(role, name)], notBefore: new Date(now - 30 * DAY_MS), notAfter: new Date(now - DAY_MS) },
      role,
    );
  }

  /** Signed by the cluster CA, valid from tomorrow. */
  notYetValid(role: Role, name: string): Made {
    const now = Date.now();
    return this.#make(
      { uris: [this.#uri(role, name)], notBefore: new Date(now + DAY_MS), notAfter: new Date(now + 30 * DAY_MS) },
      role,
    );
  }

  /** Signed by the cluster CA for another trust domain. */
  otherTrustDomain(role: Role, name: string, td = 'evil.example'): Made {
    return this.#make({ uris: [this.#uri(role, name, td)] }, role);
  }

  /** Signed by the cluster CA with no URI SAN at all (the CN says the name: never read). */
  noUri(role: Role, name: string): Made {
    return this.#make({ uris: [], commonName: `spiffe://${TD}/${role}/${name}` }, role);
  }

  /** Two URI SANs: the identity and another. */
  twoUris(role: Role, name: string): Made {
    return this.#make({ uris: [this.#uri(role, name), this.#uri('operator', 'admin')] }, role);
  }

  /** The identity with extended key usages that do not fit the role (clientAuth only for a controller). */
  wrongEku(role: Role, name: string): Made {
    return this.#make(
      { uris: [this.#uri(role, name)], eku: role === 'operator' ? { serverAuth: true } : { clientAuth: true } },
      role,
    );
  }

  /** A SPIFFE path with a percent-escape (`controller%2Fcontroller`). */
  percentEscaped(role: Role, name: string): Made {
    return this.#make({ uris: [`spiffe://${TD}/${role}%2F${name}`] }, role);
  }

  /** A SPIFFE path with an extra segment (`controller/controller/x`). */
  extraSegment(role: Role, name: string): Made {
    return this.#make({ uris: [`${this.#uri(role, name)}/x`] }, role);
  }
}
