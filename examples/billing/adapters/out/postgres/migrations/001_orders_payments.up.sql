-- billing's own tables, versioned in billing_migration beside idem's
-- idem_migration. owner is the authenticated principal: one principal never
-- sees another's orders.
CREATE TABLE orders (
    id            text        PRIMARY KEY,
    owner         text        NOT NULL,
    customer_id   text        NOT NULL,
    total_kopecks bigint      NOT NULL CHECK (total_kopecks > 0),
    status        text        NOT NULL DEFAULT 'NEW'
                              CHECK (status IN ('NEW', 'CONFIRMED', 'CHARGED', 'FAILED')),
    charge_id     text,
    failure       text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE payments (
    id             text        PRIMARY KEY,
    owner          text        NOT NULL,
    order_id       text        NOT NULL REFERENCES orders (id),
    customer_id    text        NOT NULL,
    amount_kopecks bigint      NOT NULL CHECK (amount_kopecks > 0),
    status         text        NOT NULL DEFAULT 'PENDING'
                               CHECK (status IN ('PENDING', 'CHARGED', 'FAILED')),
    charge_id      text,
    failure        text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX payments_order_id_idx ON payments (order_id);
