// Package schema is the ent schema of the example: the orders and
// shipments tables of examples/orm (internal/ormtest.Schema).
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is the orders row: a string id chosen by the client, and a total.
type Order struct {
	ent.Schema
}

// Fields of the Order.
func (Order) Fields() []ent.Field {
	return []ent.Field{
		field.String("id").NotEmpty().Immutable(),
		field.Int64("total"),
	}
}

// Shipment is the shipments row the consumer writes, one per event: its
// id is the event id (column event_id).
type Shipment struct {
	ent.Schema
}

// Fields of the Shipment.
func (Shipment) Fields() []ent.Field {
	return []ent.Field{
		field.String("id").StorageKey("event_id").NotEmpty().Immutable(),
		field.String("order_id"),
	}
}
