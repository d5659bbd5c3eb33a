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
    PRIMARY KEY (account, idem_key)
);
-- A table of the first layout kept Content-Type and Location in columns of their own.
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
  END IF;
END $$;
-- Expiry and pruning go by the last sign of life.
CREATE INDEX IF NOT EXISTS "idempotency_heartbeat" ON "idempotency" (heartbeat_ms);
DROP INDEX IF EXISTS "idempotency_created";
