// Lab service, Go flavour: net/http server; outbound calls through http.Client wrapped in the
// retry loop Go users typically write (attempts, jittered backoff, retry on 5xx and transport
// errors). It knows nothing about the agent. Config: JSON in $LAB_CFG; ground truth: one JSON
// line per request served, appended to cfg.Log.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

type Fault struct {
	Kind      string  `json:"kind"`
	Rate      float64 `json:"rate"`
	Start     float64 `json:"start"`
	End       float64 `json:"end"`
	LatencyMs int     `json:"latency_ms"`
}

type Downstream struct {
	Name      string   `json:"name"`
	URL       string   `json:"url"`
	Retries   int      `json:"retries"`
	TimeoutMs int      `json:"timeout_ms"`
	BackoffMs int      `json:"backoff_ms"`
	Budget    *float64 `json:"budget"`
}

type Config struct {
	EpochFile   string       `json:"epoch_file"`
	Name        string       `json:"name"`
	Listen      string       `json:"listen"`
	Downstreams []Downstream `json:"downstreams"`
	Fault       *Fault       `json:"fault"`
	WorkMs      int          `json:"work_ms"`
	// ForwardTrace: the inbound traceparent's trace id on every outbound call (OpenTelemetry).
	ForwardTrace bool `json:"forward_trace"`
	// Fanout: the downstreams are called at once, each from a goroutine the handler spawns,
	// which hands the call to a worker goroutine of its own (two levels, as errgroup users and
	// worker pools do); the request waits for all of them.
	Fanout bool   `json:"fanout"`
	Log    string `json:"log"`
}

// budget: each first attempt deposits ratio tokens, each retry withdraws one.
type budget struct {
	mu     sync.Mutex
	ratio  float64
	tokens float64
}

func (b *budget) deposit() {
	b.mu.Lock()
	b.tokens += b.ratio
	if b.tokens > 10 {
		b.tokens = 10
	}
	b.mu.Unlock()
}

func (b *budget) withdraw() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

type caller struct {
	ds     Downstream
	client *http.Client
	budget *budget
}

// do is the usual hand-written retry loop: try, and on a transport error or 5xx back off with
// jitter and try again, up to ds.Retries more times.
func (c *caller) do(reqID, trace string) (bool, int) {
	if c.budget != nil {
		c.budget.deposit()
	}
	attempts := 0
	for {
		attempts++
		// A distinct path and request id per logical request, the same on every retry of it.
		req, err := http.NewRequest("GET", c.ds.URL+"/"+reqID, nil)
		if err != nil {
			return false, attempts
		}
		req.Header.Set("x-lab-parent", reqID)
		req.Header.Set("x-request-id", reqID)
		if trace != "" {
			req.Header.Set("traceparent", trace)
		}
		resp, err := c.client.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return true, attempts
			}
		}
		if attempts > c.ds.Retries {
			return false, attempts
		}
		if c.budget != nil && !c.budget.withdraw() {
			return false, attempts
		}
		if c.ds.BackoffMs > 0 {
			time.Sleep(time.Duration(rand.Intn(c.ds.BackoffMs*attempts+1)) * time.Millisecond)
		}
	}
}

var (
	cfg     Config
	callers []*caller
	logMu   sync.Mutex
	logF    *os.File
)

var (
	epochMu  sync.Mutex
	epochVal float64
)

// epoch is the run's time zero, written by the lab once the whole fleet listens (fault windows
// are relative to it); 0 until then.
func epoch() float64 {
	epochMu.Lock()
	defer epochMu.Unlock()
	if epochVal == 0 {
		if b, err := os.ReadFile(cfg.EpochFile); err == nil {
			fmt.Sscanf(string(b), "%g", &epochVal)
		}
	}
	return epochVal
}

func faultNow() *Fault {
	f := cfg.Fault
	if f == nil {
		return nil
	}
	e := epoch()
	if e == 0 {
		return nil
	}
	now := float64(time.Now().UnixNano())/1e9 - e
	if now >= f.Start && now < f.End && rand.Float64() < f.Rate {
		return f
	}
	return nil
}

func handler(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	reqID := fmt.Sprintf("%016x", rand.Uint64())
	trace := outboundTrace(r.Header.Get("traceparent"))
	attempts := map[string]int{}
	cause := "none"
	if cfg.Fanout && len(callers) > 1 {
		cause = fanOut(reqID, trace, attempts)
	} else {
		for _, c := range callers {
			ok, n := c.do(reqID, trace)
			attempts[c.ds.Name] = n
			if !ok {
				cause = "downstream"
				break
			}
		}
	}
	var fault *Fault
	if cause == "none" {
		fault = faultNow()
	}
	if fault != nil {
		if fault.Kind == "latency" {
			time.Sleep(time.Duration(fault.LatencyMs) * time.Millisecond)
		} else {
			cause = "own"
		}
	}
	if cfg.WorkMs > 0 {
		time.Sleep(time.Duration(cfg.WorkMs) * time.Millisecond)
	}
	status := map[string]int{"none": 200, "own": 503, "downstream": 502}[cause]
	w.Header().Set("Content-Length", "3")
	w.WriteHeader(status)
	_, werr := w.Write([]byte("ok\n"))
	rec := map[string]interface{}{
		"t": float64(t0.UnixNano()) / 1e9, "d": time.Since(t0).Seconds(), "svc": cfg.Name,
		"id": reqID, "parent": nilIfEmpty(r.Header.Get("x-lab-parent")), "cause": cause,
		"ok": cause == "none", "attempts": attempts, "fault": fault != nil, "status": status,
	}
	if werr != nil || r.Context().Err() != nil {
		rec["abandoned"] = true
	}
	line, _ := json.Marshal(rec)
	logMu.Lock()
	logF.Write(append(line, '\n'))
	logMu.Unlock()
}

type result struct {
	name string
	ok   bool
	n    int
}

// fanOut calls every downstream at once: a goroutine per downstream, each handing its call to
// a worker goroutine and waiting for its answer; "downstream" when any of them failed.
func fanOut(reqID, trace string, attempts map[string]int) string {
	results := make(chan result, len(callers))
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Add(1)
		go func(c *caller) {
			defer wg.Done()
			done := make(chan result, 1)
			go func() {
				ok, n := c.do(reqID, trace)
				done <- result{c.ds.Name, ok, n}
			}()
			results <- <-done
		}(c)
	}
	wg.Wait()
	close(results)
	cause := "none"
	for r := range results {
		attempts[r.name] = r.n
		if !r.ok {
			cause = "downstream"
		}
	}
	return cause
}

// outboundTrace: with ForwardTrace, the inbound W3C trace context's trace id under a new span
// id (a new trace when none came in); otherwise no trace header.
func outboundTrace(inbound string) string {
	if !cfg.ForwardTrace {
		return ""
	}
	parts := strings.Split(inbound, "-")
	traceID := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	if len(parts) == 4 && len(parts[1]) == 32 {
		traceID = parts[1]
	}
	return fmt.Sprintf("00-%s-%016x-01", traceID, rand.Uint64())
}

func nilIfEmpty(s string) interface{} {
	if s == "" {
		return nil
	}
	return s
}

func main() {
	if err := json.Unmarshal([]byte(os.Getenv("LAB_CFG")), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bad LAB_CFG:", err)
		os.Exit(64)
	}
	var err error
	logF, err = os.OpenFile(cfg.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "log:", err)
		os.Exit(1)
	}
	rand.Seed(time.Now().UnixNano())
	for _, ds := range cfg.Downstreams {
		c := &caller{ds: ds, client: &http.Client{
			Timeout:   time.Duration(ds.TimeoutMs) * time.Millisecond,
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
		}}
		if ds.Budget != nil {
			c.budget = &budget{ratio: *ds.Budget}
		}
		callers = append(callers, c)
	}
	srv := &http.Server{Addr: cfg.Listen, Handler: http.HandlerFunc(handler)}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}
