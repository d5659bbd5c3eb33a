-- The sw-outbox-idempotency ledger (PostgreSQL). Safe to run again.
CREATE TABLE IF NOT EXISTS "idempotency" (
    account TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    body_sha256 BYTEA NOT NULL,
    claim_token TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'completed')),
    -- Milliseconds since the Unix epoch, by the database's clock.
    created_ms BIGINT NOT NULL,
    -- The last sign of life: the claim, a heartbeat, or the completion.
    heartbeat_ms BIGINT NOT NULL,
    status INTEGER,
    headers TEXT,
    body BYTEA,
    -- The request's Content-Type (part of its fingerprint); NULL in entries from before it
    -- was, which match a retry of any type.
    content_type TEXT,
    -- Claimed in transactional mode: alive exactly while its row lock is held.
    held BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (account, idem_key)
);
-- A table of the first layout kept the answer's Content-Type and Location in columns of
-- their own: the answer's type moves into the stored headers, and the column is then the
-- request's, NULL for these entries.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('"idempotency"')
             AND attname = 'content_type' AND NOT attisdropped)
     AND NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('"idempotency"')
             AND attname = 'headers' AND NOT attisdropped) THEN
    ALTER TABLE "idempotency" ADD COLUMN headers TEXT;
    UPDATE "idempotency" SET headers = (
      SELECT COALESCE(json_agg(json_build_array(h.n, h.v)), '[]'::json)::text
      FROM (VALUES ('content-type', content_type), ('location', location)) AS h(n, v)
      WHERE h.v IS NOT NULL)
    WHERE state = 'completed';
    UPDATE "idempotency" SET content_type = NULL;
  END IF;
END $$;
-- Tables of the second layout: no request type, no transactional mode.
ALTER TABLE "idempotency" ADD COLUMN IF NOT EXISTS content_type TEXT;
ALTER TABLE "idempotency" ADD COLUMN IF NOT EXISTS held BOOLEAN NOT NULL DEFAULT false;
-- Expiry and pruning go by the last sign of life.
CREATE INDEX IF NOT EXISTS "idempotency_heartbeat" ON "idempotency" (heartbeat_ms);
DROP INDEX IF EXISTS "idempotency_created";
