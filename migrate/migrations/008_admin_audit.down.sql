DROP TABLE idem_admin_audit;
