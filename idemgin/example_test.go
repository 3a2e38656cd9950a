package idemgin_test

import (
	"context"
	"errors"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemgin"
	"github.com/idemkit/idem/idempotency"
)

// Example guards a gin route group in transactional mode: the charge row
// and the stored response commit together.
func Example() {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), &idempotency.Config{
		Scope: func(r *http.Request) (string, error) {
			if u := r.Header.Get("Authorization"); u != "" {
				return u, nil
			}
			return "", errors.New("no principal")
		},
		Mode: idempotency.ModeTransactional,
	})
	if err != nil {
		panic(err)
	}
	e := gin.New()
	e.Use(gin.Recovery(), idemgin.New(mw))
	e.POST("/charges/:account", func(c *gin.Context) {
		tx, _ := idemgin.Tx(c)
		var id int64
		err := tx.QueryRow(c.Request.Context(), `INSERT INTO charge (account) VALUES ($1) RETURNING id`, c.Param("account")).Scan(&id)
		if err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": "database"}) // released: a retry runs again
			return
		}
		c.JSON(http.StatusCreated, gin.H{"id": id})
	})
	_ = e.Run(":8080")
}
