package idemgin_test

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/idemgin"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/adaptertest"
)

// TestCrashTakeover SIGKILLs a real gin server process between the
// handler's write and the stored response, restarts it and retries the key
// (adaptertest.CrashTakeover says what each mode must do).
func TestCrashTakeover(t *testing.T) {
	t.Parallel()
	adaptertest.CrashTakeover(t)
}

// TestCrashChild is the gin server of TestCrashTakeover; run by the test
// alone it does nothing.
func TestCrashChild(t *testing.T) {
	adaptertest.CrashChild(t, func(ln net.Listener, mw *idempotency.Middleware, effect adaptertest.Effect) error {
		e := gin.New()
		e.Use(gin.Recovery(), idemgin.New(mw))
		e.POST("/effects", func(c *gin.Context) {
			tx, _ := idemgin.Tx(c)
			id, err := effect(c.Request.Context(), tx)
			if err != nil {
				c.String(http.StatusInternalServerError, err.Error())
				return
			}
			c.JSON(http.StatusCreated, gin.H{"effect": id})
		})
		return (&http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
	})
}
