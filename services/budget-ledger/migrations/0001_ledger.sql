-- Budget ledger schema. Portable SQL (SQLite now, PostgreSQL later): BIGINT for money
-- (integer micro-USD) and timestamps, TEXT for ids and states, 0/1 BIGINT for flags.

CREATE TABLE accounts (
    account_id      TEXT PRIMARY KEY,
    budget_micros   BIGINT NOT NULL CHECK (budget_micros >= 0),
    created_unix_ms BIGINT NOT NULL
);

CREATE TABLE reservations (
    reservation_id   TEXT PRIMARY KEY,
    account_id       TEXT NOT NULL REFERENCES accounts (account_id),
    amount_micros    BIGINT NOT NULL CHECK (amount_micros > 0),
    -- HELD, COMMITTED or RELEASED
    state            TEXT NOT NULL CHECK (state IN ('HELD', 'COMMITTED', 'RELEASED')),
    committed_micros BIGINT NOT NULL DEFAULT 0 CHECK (committed_micros >= 0),
    budget_exceeded  BIGINT NOT NULL DEFAULT 0,
    holder           TEXT NOT NULL,
    created_unix_ms  BIGINT NOT NULL
);

CREATE INDEX reservations_by_account_state ON reservations (account_id, state);
CREATE INDEX reservations_by_holder ON reservations (holder);

-- One row per mutating call: written in the same transaction as its effect, so a
-- replayed key returns exactly what the first call returned.
CREATE TABLE idempotency_keys (
    idempotency_key TEXT PRIMARY KEY,
    operation       TEXT NOT NULL,
    -- The request (without its key) as canonical JSON, to refuse a reused key.
    fingerprint     TEXT NOT NULL,
    -- The response as JSON.
    response        TEXT NOT NULL,
    created_unix_ms BIGINT NOT NULL
);
