-- Double-entry postings, tenant accounts and incremental charges. Portable SQL (SQLite
-- and PostgreSQL run the same migrations).

ALTER TABLE accounts ADD COLUMN kind TEXT NOT NULL DEFAULT 'RUN';
ALTER TABLE accounts ADD COLUMN parent_account_id TEXT NOT NULL DEFAULT '';
ALTER TABLE accounts ADD COLUMN allow_overdraft BIGINT NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN commit_overage TEXT NOT NULL DEFAULT 'CAP';
-- Labels as a JSON object.
ALTER TABLE accounts ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
-- Balances kept with every posting (checked against the postings by the audit).
ALTER TABLE accounts ADD COLUMN reserved_micros BIGINT NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN spent_micros BIGINT NOT NULL DEFAULT 0;
-- The seq of the account's last posting.
ALTER TABLE accounts ADD COLUMN posting_seq BIGINT NOT NULL DEFAULT 0;

ALTER TABLE reservations ADD COLUMN charged_micros BIGINT NOT NULL DEFAULT 0;

UPDATE accounts SET
  reserved_micros = (SELECT COALESCE(SUM(r.amount_micros), 0) FROM reservations r
                     WHERE r.account_id = accounts.account_id AND r.state = 'HELD'),
  spent_micros = (SELECT COALESCE(SUM(r.committed_micros), 0) FROM reservations r
                  WHERE r.account_id = accounts.account_id AND r.state = 'COMMITTED');

-- One row per balanced movement of money.
CREATE TABLE transfers (
    transfer_id     TEXT PRIMARY KEY,
    -- OPENING, FUND, RESERVE, CHARGE, COMMIT or RELEASE
    kind            TEXT NOT NULL,
    account_id      TEXT NOT NULL REFERENCES accounts (account_id),
    reservation_id  TEXT NOT NULL DEFAULT '',
    amount_micros   BIGINT NOT NULL,
    -- What this transfer moved into SPENT: the spend report sums it.
    spent_micros    BIGINT NOT NULL DEFAULT 0,
    run_id          TEXT NOT NULL DEFAULT '',
    fork            TEXT NOT NULL DEFAULT '',
    model           TEXT NOT NULL DEFAULT '',
    tenant_id       TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT NOT NULL DEFAULT '',
    created_unix_ms BIGINT NOT NULL
);
CREATE INDEX transfers_by_time ON transfers (created_unix_ms);
CREATE INDEX transfers_by_run ON transfers (run_id, created_unix_ms);
CREATE INDEX transfers_by_tenant ON transfers (tenant_id, created_unix_ms);

-- The legs of the transfers: signed amounts per account bucket (FUNDING, AVAILABLE,
-- RESERVED, SPENT); the legs of a transfer sum to zero.
CREATE TABLE postings (
    account_id      TEXT NOT NULL REFERENCES accounts (account_id),
    seq             BIGINT NOT NULL,
    transfer_id     TEXT NOT NULL REFERENCES transfers (transfer_id),
    bucket          TEXT NOT NULL CHECK (bucket IN ('FUNDING', 'AVAILABLE', 'RESERVED', 'SPENT')),
    amount_micros   BIGINT NOT NULL,
    created_unix_ms BIGINT NOT NULL,
    PRIMARY KEY (account_id, seq)
);
CREATE INDEX postings_by_transfer ON postings (transfer_id);

-- Accounts that predate postings get one opening transfer with their balances.
INSERT INTO transfers (transfer_id, kind, account_id, amount_micros, spent_micros, run_id, created_unix_ms)
SELECT 'opening-' || account_id, 'OPENING', account_id, budget_micros, spent_micros, account_id, created_unix_ms
FROM accounts;
INSERT INTO postings (account_id, seq, transfer_id, bucket, amount_micros, created_unix_ms)
SELECT account_id, 1, 'opening-' || account_id, 'FUNDING', -budget_micros, created_unix_ms FROM accounts;
INSERT INTO postings (account_id, seq, transfer_id, bucket, amount_micros, created_unix_ms)
SELECT account_id, 2, 'opening-' || account_id, 'AVAILABLE', budget_micros - reserved_micros - spent_micros, created_unix_ms FROM accounts;
INSERT INTO postings (account_id, seq, transfer_id, bucket, amount_micros, created_unix_ms)
SELECT account_id, 3, 'opening-' || account_id, 'RESERVED', reserved_micros, created_unix_ms FROM accounts;
INSERT INTO postings (account_id, seq, transfer_id, bucket, amount_micros, created_unix_ms)
SELECT account_id, 4, 'opening-' || account_id, 'SPENT', spent_micros, created_unix_ms FROM accounts;
UPDATE accounts SET posting_seq = 4;
