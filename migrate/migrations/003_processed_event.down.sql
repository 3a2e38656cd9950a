DROP TABLE IF EXISTS processed_event;
