/**
 * The tables of Heat's object store (docs/heat.md), in each store's dialect: the accounts' temp-url
 * keys, containers, objects, and the link from a deployment Heat put in a node's metadata to that
 * metadata object and to the signal object Heat reads its result from. A removed deployment's link
 * goes with it (a trigger), whichever code path removes the row. Harmless run again over its own
 * result, as every migration is.
 */

const TABLES = (blob: string, bigint: string, strict: string) => `
  CREATE TABLE IF NOT EXISTS object_accounts (
    project TEXT PRIMARY KEY,
    temp_url_key TEXT,
    updated_at TEXT NOT NULL
  )${strict};
  CREATE TABLE IF NOT EXISTS object_containers (
    project TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (project, name)
  )${strict};
  CREATE TABLE IF NOT EXISTS objects (
    project TEXT NOT NULL,
    container TEXT NOT NULL,
    name TEXT NOT NULL,
    body ${blob} NOT NULL,
    content_type TEXT NOT NULL,
    etag TEXT NOT NULL,
    modified_ms ${bigint} NOT NULL,
    PRIMARY KEY (project, container, name)
  )${strict};
  CREATE TABLE IF NOT EXISTS heat_links (
    deployment_id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    source TEXT NOT NULL,
    heat_key TEXT NOT NULL,
    heat_item_id TEXT NOT NULL,
    signal_project TEXT,
    signal_container TEXT,
    signal_object TEXT
  )${strict};
  CREATE UNIQUE INDEX IF NOT EXISTS heat_links_by_key ON heat_links (node, source, heat_key);
`;

export const SQLITE_OBJECTS_MIGRATION_SQL = `${TABLES('BLOB', 'INTEGER', ' STRICT')}
  CREATE TRIGGER IF NOT EXISTS heat_link_removed AFTER DELETE ON deployments BEGIN
    DELETE FROM heat_links WHERE deployment_id = OLD.id;
  END;
`;

export const PG_OBJECTS_MIGRATION_SQL = `${TABLES('BYTEA', 'BIGINT', '')}
  CREATE OR REPLACE FUNCTION heat_link_removed() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    DELETE FROM heat_links WHERE deployment_id = OLD.id;
    RETURN OLD;
  END $$;
  CREATE TRIGGER heat_link_removed AFTER DELETE ON deployments
    FOR EACH ROW EXECUTE FUNCTION heat_link_removed();
`;
