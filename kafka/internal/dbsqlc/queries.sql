-- name: LockRedrive :exec
-- Serializes the redrives of one dead-letter topic until the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('idem_dlq_redrive'), hashtext(sqlc.arg(dlq_topic)::text));

-- name: RedrivenRecords :many
SELECT r.dlq_partition, r.dlq_offset, r.target, r.audit_id, r.last_at, a.actor
FROM idem_dlq_redrive r JOIN idem_admin_audit a ON a.id = r.audit_id
WHERE r.dlq_topic = $1;

-- name: InsertRedriveAudit :one
INSERT INTO idem_admin_audit (action, subject, actor, reason)
VALUES ('dlq.redrive', sqlc.arg(subject), sqlc.arg(actor), sqlc.arg(reason))
RETURNING id;

-- name: RecordRedrive :exec
INSERT INTO idem_dlq_redrive (dlq_topic, dlq_partition, dlq_offset, target, audit_id)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO UPDATE
SET target = excluded.target, audit_id = excluded.audit_id, redrives = idem_dlq_redrive.redrives + 1, last_at = now();

-- name: SetRedriveAuditDetail :exec
UPDATE idem_admin_audit SET detail = sqlc.arg(detail)::jsonb WHERE id = sqlc.arg(id);
