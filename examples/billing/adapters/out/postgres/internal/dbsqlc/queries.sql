-- name: InsertOrder :exec
INSERT INTO orders (id, owner, customer_id, total_kopecks)
VALUES (@id, @owner, @customer_id, @total_kopecks);

-- name: GetOrder :one
SELECT * FROM orders WHERE id = @id AND owner = @owner;

-- name: GetOrderAny :one
SELECT * FROM orders WHERE id = @id;

-- ConfirmOrder moves NEW to CONFIRMED; no row means not found or not NEW.
-- name: ConfirmOrder :one
UPDATE orders SET status = 'CONFIRMED', updated_at = now()
WHERE id = @id AND owner = @owner AND status = 'NEW'
RETURNING *;

-- SettleOrder records the charge outcome once: only a CONFIRMED order moves.
-- name: SettleOrder :execrows
UPDATE orders SET status = @status, charge_id = sqlc.narg(charge_id), failure = sqlc.narg(failure), updated_at = now()
WHERE id = @id AND status = 'CONFIRMED';

-- name: InsertPayment :exec
INSERT INTO payments (id, owner, order_id, customer_id, amount_kopecks)
VALUES (@id, @owner, @order_id, @customer_id, @amount_kopecks);

-- name: GetPayment :one
SELECT * FROM payments WHERE id = @id AND owner = @owner;

-- SettlePayment records the charge outcome once: only a PENDING payment moves.
-- name: SettlePayment :execrows
UPDATE payments SET status = @status, charge_id = sqlc.narg(charge_id), failure = sqlc.narg(failure), updated_at = now()
WHERE id = @id AND status = 'PENDING';

-- LockOrder reads an order of the owner's and holds its row lock until the
-- transaction ends: the payments and the confirm of one order queue here,
-- so each sees the others' committed payments (READ COMMITTED takes a new
-- snapshot for the next statement, after the lock was granted).
-- name: LockOrder :one
SELECT * FROM orders WHERE id = @id AND owner = @owner FOR UPDATE;

-- PaidKopecks sums the order's payments that are not FAILED: what is
-- charged or being charged.
-- name: PaidKopecks :one
SELECT coalesce(sum(amount_kopecks), 0)::bigint AS paid
FROM payments WHERE order_id = @order_id AND status <> 'FAILED';
