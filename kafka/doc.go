// Package kafka adapts idem's core packages to Kafka through franz-go: an
// outbox publisher (one produce call per relay batch) and a consumer runner
// that commits offsets only after the handler's database transaction. The
// consumer is package consume's broker-neutral loop on a franz-go driver,
// which passes consume/consumertest against kfake.
//
// Usage:
//
//	client, _ := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(brokers...))...)
//	_ = kafka.EnsureTopics(ctx, client, 3, "orders.events", "orders.events.dlq")
//	pub, err := kafka.NewPublisher(client, nil) // for outbox.NewRelay
//	c, err := kafka.NewConsumer(pool, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
//		return apply(ctx, tx, kafka.RecordEventType(rec), rec.Value)
//	}, &kafka.ConsumerConfig{Brokers: brokers, Group: "billing", Topics: []string{"orders.events"}})
//	_ = c.Start(ctx) // checks orders.events.dlq exists
//
// The core packages (outbox, inbox, consume) never import franz-go; this
// package does.
package kafka
