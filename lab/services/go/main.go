// Lab service, Go flavour: net/http server; outbound calls through http.Client wrapped in the
// retry loop Go users typically write (attempts, jittered backoff, retry on 5xx and transport
// errors). It knows nothing about the agent. Config: JSON in $LAB_CFG; ground truth: one JSON
// line per request served, appended to cfg.Log. Built with `-tags grpc` (grpc.go, GOPATH mode
// against Debian's gRPC-go) it is the gRPC-go flavour too: `"proto": "grpc"` serves
// /lab.Hop/Work, and gRPC downstreams are called with grpc-go.
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
	Proto     string   `json:"proto"`
	Retries   int      `json:"retries"`
	TimeoutMs int      `json:"timeout_ms"`
	BackoffMs int      `json:"backoff_ms"`
	Budget    *float64 `json:"budget"`
}

type Config struct {
	EpochFile   string       `json:"epoch_file"`
	Name        string       `json:"name"`
	Listen      string       `json:"listen"`
	Proto       string       `json:"proto"`
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
	// attempt: one try; whether it succeeded, and whether its failure is worth a retry.
	attempt func(reqID, trace string) (ok, retryable bool)
}

// do is the usual hand-written retry loop: try, and on a retryable failure back off with
// jitter and try again, up to ds.Retries more times.
func (c *caller) do(reqID, trace string) (bool, int) {
	if c.budget != nil {
		c.budget.deposit()
	}
	attempts := 0
	for {
		attempts++
		ok, retryable := c.attempt(reqID, trace)
		if ok {
			return true, attempts
		}
		if !retryable || attempts > c.ds.Retries {
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

// httpAttempt: one GET; a transport error or a 5xx is worth a retry.
func (c *caller) httpAttempt(reqID, trace string) (bool, bool) {
	{
		// A distinct path and request id per logical request, the same on every retry of it.
		req, err := http.NewRequest("GET", c.ds.URL+"/"+reqID, nil)
		if err != nil {
			return false, false
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
				return true, false
			}
		}
		return false, true
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

// served is one request served: what it did, for the caller's answer and the ground truth.
type served struct {
	t0       time.Time
	reqID    string
	parent   string
	cause    string
	attempts map[string]int
	fault    bool
}

// serve does a request's work: every downstream (one after another, or at once with Fanout),
// then maybe its own failure, then cfg.WorkMs of work.
func serve(parent, traceIn string) served {
	s := served{t0: time.Now(), reqID: fmt.Sprintf("%016x", rand.Uint64()), parent: parent,
		cause: "none", attempts: map[string]int{}}
	trace := outboundTrace(traceIn)
	if cfg.Fanout && len(callers) > 1 {
		s.cause = fanOut(s.reqID, trace, s.attempts)
	} else {
		for _, c := range callers {
			ok, n := c.do(s.reqID, trace)
			s.attempts[c.ds.Name] = n
			if !ok {
				s.cause = "downstream"
				break
			}
		}
	}
	var fault *Fault
	if s.cause == "none" {
		fault = faultNow()
	}
	if fault != nil {
		if fault.Kind == "latency" {
			time.Sleep(time.Duration(fault.LatencyMs) * time.Millisecond)
		} else {
			s.cause = "own"
		}
	}
	s.fault = fault != nil
	if cfg.WorkMs > 0 {
		time.Sleep(time.Duration(cfg.WorkMs) * time.Millisecond)
	}
	return s
}

// record appends the ground-truth line of a request served, with the status it was answered
// with and any fields of its protocol.
func (s served) record(status int, extra map[string]interface{}) {
	rec := map[string]interface{}{
		"t": float64(s.t0.UnixNano()) / 1e9, "d": time.Since(s.t0).Seconds(), "svc": cfg.Name,
		"id": s.reqID, "parent": nilIfEmpty(s.parent), "cause": s.cause,
		"ok": s.cause == "none", "attempts": s.attempts, "fault": s.fault, "status": status,
	}
	for k, v := range extra {
		rec[k] = v
	}
	line, _ := json.Marshal(rec)
	logMu.Lock()
	logF.Write(append(line, '\n'))
	logMu.Unlock()
}

func handler(w http.ResponseWriter, r *http.Request) {
	s := serve(r.Header.Get("x-lab-parent"), r.Header.Get("traceparent"))
	status := map[string]int{"none": 200, "own": 503, "downstream": 502}[s.cause]
	w.Header().Set("Content-Length", "3")
	w.WriteHeader(status)
	_, werr := w.Write([]byte("ok\n"))
	var extra map[string]interface{}
	if werr != nil || r.Context().Err() != nil {
		extra = map[string]interface{}{"abandoned": true}
	}
	s.record(status, extra)
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
		c := &caller{ds: ds}
		if ds.Proto == "grpc" {
			c.attempt = grpcAttempt(ds)
		} else {
			c.client = &http.Client{
				Timeout:   time.Duration(ds.TimeoutMs) * time.Millisecond,
				Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
			}
			c.attempt = c.httpAttempt
		}
		if ds.Budget != nil {
			c.budget = &budget{ratio: *ds.Budget}
		}
		callers = append(callers, c)
	}
	if cfg.Proto == "grpc" {
		serveGRPC()
		return
	}
	srv := &http.Server{Addr: cfg.Listen, Handler: http.HandlerFunc(handler)}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}
