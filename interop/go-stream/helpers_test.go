// Package streaminterop drives a broker's RabbitMQ Stream protocol port (RabbitMQ's
// rabbitmq_stream plugin as the reference, Lepus as the system under test) through RabbitMQ's
// Go stream client, github.com/rabbitmq/rabbitmq-stream-go-client.
package streaminterop

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// waitTimeout bounds every wait for confirms and deliveries.
const waitTimeout = 10 * time.Second

// quietPeriod is how long we watch for something that must NOT arrive.
const quietPeriod = 500 * time.Millisecond

// streamURL is the broker under test, from STREAM_URL.
func streamURL() string {
	if u := os.Getenv("STREAM_URL"); u != "" {
		return u
	}
	return "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f"
}

// hostPort is the host and port of a stream URL.
func hostPort(t *testing.T, raw string) (string, int) {
	t.Helper()
	parsed, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("cannot parse %q: %v", raw, err)
	}
	port, err := strconv.Atoi(parsed.Port())
	if err != nil {
		t.Fatalf("no port in %q", raw)
	}
	return parsed.Hostname(), port
}

// environment opens an environment on rawURL, closed when the test ends. The address
// resolver sends every connection (the locator's and the leader's) to the URL's address,
// whatever host the broker advertises; with STREAM_FOLLOW_METADATA set (a cluster, whose nodes
// advertise where they listen) the client connects where `metadata` says instead, producers to
// a stream's leader and consumers to its replicas, as applications do.
func environment(t *testing.T, rawURL string) *stream.Environment {
	t.Helper()
	env, err := openEnvironment(t, rawURL)
	if err != nil {
		t.Fatalf("environment on %s: %v", rawURL, err)
	}
	return env
}

func openEnvironment(t *testing.T, rawURL string) (*stream.Environment, error) {
	t.Helper()
	options := stream.NewEnvironmentOptions().SetUri(rawURL).SetRPCTimeout(waitTimeout)
	if os.Getenv("STREAM_FOLLOW_METADATA") == "" {
		host, port := hostPort(t, rawURL)
		options = options.SetAddressResolver(stream.AddressResolver{Host: host, Port: port})
	}
	env, err := stream.NewEnvironment(options)
	if err == nil {
		t.Cleanup(func() { _ = env.Close() })
	}
	return env, err
}

// streamName is a unique stream name for the test, deleted when it ends.
func streamName(t *testing.T, env *stream.Environment) string {
	t.Helper()
	random := make([]byte, 4)
	_, _ = rand.Read(random)
	name := fmt.Sprintf("lepus.go-stream.%s.%s", strings.ReplaceAll(t.Name(), "/", "."), hex.EncodeToString(random))
	t.Cleanup(func() { _ = env.DeleteStream(name) })
	return name
}

// declared declares a fresh stream for the test.
func declared(t *testing.T, env *stream.Environment) string {
	t.Helper()
	name := streamName(t, env)
	if err := env.DeclareStream(name, stream.NewStreamOptions().SetMaxLengthBytes(stream.ByteCapacity{}.MB(100))); err != nil {
		t.Fatalf("declare stream %s: %v", name, err)
	}
	return name
}

// publishConfirmed sends bodies one by one (each its own publish frame, so each its own chunk
// on the broker) and waits for each confirm before the next.
func publishConfirmed(t *testing.T, producer *stream.Producer, confirms stream.ChannelPublishConfirm, bodies ...string) {
	t.Helper()
	for _, body := range bodies {
		if err := producer.Send(amqp.NewMessage([]byte(body))); err != nil {
			t.Fatalf("send %q: %v", body, err)
		}
		waitConfirmed(t, confirms, 1)
	}
}

// waitConfirmed waits for count confirmations, failing on a refused one.
func waitConfirmed(t *testing.T, confirms stream.ChannelPublishConfirm, count int) []int64 {
	t.Helper()
	var ids []int64
	deadline := time.After(waitTimeout)
	for len(ids) < count {
		select {
		case statuses := <-confirms:
			for _, status := range statuses {
				if !status.IsConfirmed() {
					t.Fatalf("publishing id %d not confirmed: %v (code %d)", status.GetPublishingId(), status.GetError(), status.GetErrorCode())
				}
				ids = append(ids, status.GetPublishingId())
			}
		case <-deadline:
			t.Fatalf("%d of %d confirms within %s", len(ids), count, waitTimeout)
		}
	}
	return ids
}

// received is what a consumer got: bodies and offsets in order.
type received struct {
	mu      sync.Mutex
	bodies  []string
	offsets []int64
	arrived chan struct{}
}

func newReceived() *received {
	return &received{arrived: make(chan struct{}, 1_000_000)}
}

func (r *received) handler(ctx stream.ConsumerContext, message *amqp.Message) {
	r.mu.Lock()
	r.bodies = append(r.bodies, string(message.GetData()))
	r.offsets = append(r.offsets, ctx.Consumer.GetOffset())
	r.mu.Unlock()
	r.arrived <- struct{}{}
}

// wait waits until count messages arrived and returns them.
func (r *received) wait(t *testing.T, count int) ([]string, []int64) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		r.mu.Lock()
		got := len(r.bodies)
		r.mu.Unlock()
		if got >= count {
			break
		}
		select {
		case <-r.arrived:
		case <-deadline:
			t.Fatalf("%d of %d messages within %s", got, count, waitTimeout)
		}
	}
	// Nothing more may follow.
	time.Sleep(quietPeriod)
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...), append([]int64(nil), r.offsets...)
}

// consume subscribes from offset and returns what arrives.
func consume(t *testing.T, env *stream.Environment, name string, offset stream.OffsetSpecification) *received {
	t.Helper()
	got := newReceived()
	consumer, err := env.NewConsumer(name, got.handler, stream.NewConsumerOptions().SetOffset(offset))
	if err != nil {
		t.Fatalf("consumer on %s: %v", name, err)
	}
	t.Cleanup(func() { _ = consumer.Close() })
	return got
}

// restartableBroker is a broker this suite may restart: its own Lepus (LEPUS_BIN), or the
// RabbitMQ node RABBITMQCTL reaches (stop_app, start_app).
type restartableBroker struct {
	url     string
	restart func(t *testing.T)
	// crash kills the broker with SIGKILL and starts it again (own Lepus only; nil otherwise).
	crash func(t *testing.T)
}

// restartable returns a broker the test may restart, or skips the test saying why not.
func restartable(t *testing.T) restartableBroker {
	t.Helper()
	if bin := os.Getenv("LEPUS_BIN"); bin != "" {
		return ownLepus(t, bin)
	}
	if ctl := os.Getenv("RABBITMQCTL"); ctl != "" {
		words := strings.Fields(ctl)
		run := func(t *testing.T, action string) {
			command := exec.Command(words[0], append(words[1:], action)...)
			if output, err := command.CombinedOutput(); err != nil {
				t.Fatalf("%s %s: %v\n%s", ctl, action, err, output)
			}
		}
		return restartableBroker{url: streamURL(), restart: func(t *testing.T) {
			run(t, "stop_app")
			run(t, "start_app")
			waitListening(t, streamURL())
		}}
	}
	t.Skip("needs a broker to restart: LEPUS_BIN (the suite starts its own Lepus) or RABBITMQCTL")
	return restartableBroker{}
}

func freePort(t *testing.T) int {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port
}

func waitListening(t *testing.T, rawURL string) {
	t.Helper()
	host, port := hostPort(t, rawURL)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), time.Second); err == nil {
			conn.Close()
			// The listener is up; give the broker a moment to finish booting its streams.
			time.Sleep(500 * time.Millisecond)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %s:%d after 60 s", host, port)
}

// ownLepus starts a Lepus of the suite's own on free ports and a temporary data directory.
func ownLepus(t *testing.T, bin string) restartableBroker {
	t.Helper()
	dataDir := t.TempDir()
	amqpPort, streamPort := freePort(t), freePort(t)
	var current *exec.Cmd
	start := func(t *testing.T) {
		command := exec.Command(bin, "server", "--data-dir", dataDir, "--bind", "127.0.0.1",
			"--amqp-port", strconv.Itoa(amqpPort), "--stream-port", strconv.Itoa(streamPort),
			"--stream-advertised-host", "127.0.0.1", "--http-port", "0", "--metrics-port", "0")
		command.Stdout, command.Stderr = os.Stderr, os.Stderr
		if err := command.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		current = command
	}
	stopWith := func(signal syscall.Signal) {
		if current != nil {
			_ = current.Process.Signal(signal)
			_, _ = current.Process.Wait()
			current = nil
		}
	}
	stop := func() { stopWith(syscall.SIGTERM) }
	rawURL := fmt.Sprintf("rabbitmq-stream://guest:guest@127.0.0.1:%d/%%2f", streamPort)
	start(t)
	t.Cleanup(stop)
	waitListening(t, rawURL)
	return restartableBroker{url: rawURL, restart: func(t *testing.T) {
		stop()
		start(t)
		waitListening(t, rawURL)
	}, crash: func(t *testing.T) {
		stopWith(syscall.SIGKILL)
		start(t)
		waitListening(t, rawURL)
	}}
}
