package inbox

// SetPassHook makes the purger report rows deleted per pass on ch.
func (p *Purger) SetPassHook(ch chan int64) { p.passes = ch }
