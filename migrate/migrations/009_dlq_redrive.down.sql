DROP TABLE idem_dlq_redrive;
