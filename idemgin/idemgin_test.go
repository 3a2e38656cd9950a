package idemgin_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/idemgin"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/adaptertest"
)

// build serves adaptertest's contract with gin behind idemgin, gin.Recovery
// before or after it.
func build(t *testing.T, a *adaptertest.App, mw *idempotency.Middleware) string {
	e := gin.New()
	if !a.RecoveryInside {
		e.Use(gin.RecoveryWithWriter(io.Discard))
	}
	e.Use(idemgin.New(mw))
	if a.RecoveryInside {
		e.Use(gin.RecoveryWithWriter(io.Discard))
	}
	e.Use(func(c *gin.Context) {
		if !a.Gate.Wait(c.Request.Context()) {
			c.AbortWithStatus(http.StatusServiceUnavailable)
			return
		}
		c.Next()
	})
	effect := func(c *gin.Context) {
		if c.GetHeader("X-Bad") != "" {
			c.String(http.StatusUnprocessableEntity, "refused")
			return
		}
		if c.GetHeader("X-Fault") != "" {
			c.String(http.StatusInternalServerError, "injected fault")
			return
		}
		body, err := io.ReadAll(c.Request.Body)
		if err != nil {
			c.String(http.StatusBadRequest, err.Error())
			return
		}
		ctx := c.Request.Context()
		var id int64
		if tx, ok := idemgin.Tx(c); ok {
			err = tx.QueryRow(ctx, adaptertest.EffectSQL, c.GetHeader("Authorization"), string(body)).Scan(&id)
		} else {
			err = a.Pool.QueryRow(ctx, adaptertest.EffectSQL, c.GetHeader("Authorization"), string(body)).Scan(&id)
		}
		if err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		if c.GetHeader("X-Panic") != "" {
			panic("injected panic")
		}
		if c.GetHeader("X-Fail-After-Write") != "" {
			c.String(http.StatusServiceUnavailable, "failed after the write")
			return
		}
		if c.GetHeader("X-No-Store") != "" {
			idemgin.DoNotStore(c)
		}
		c.Header("Location", fmt.Sprintf("/effects/%d", id))
		c.JSON(http.StatusCreated, gin.H{"id": id})
	}
	e.POST("/charges", effect)
	e.POST("/refunds", effect)
	e.POST("/orders/:id", effect)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestAdapter runs the adapters' behaviour suite (idemtest's conformance
// suite in both modes with gin.Recovery on either side, the 50-way race on
// one key, gin's route template as the scope, release and rollback, wait
// mode, a 4xx stored) against a gin server behind idemgin.
func TestAdapter(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, build)
}
