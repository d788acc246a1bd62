package streaminterop

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// A broker killed with SIGKILL while a producer publishes keeps every confirmed message, at the
// offset it had: the confirm came after the group commit's fdatasync. Offsets are never reused
// or skipped: after the restart the stream reads back 0, 1, 2, ... with no hole, and a message
// published after the restart takes the next offset.
func TestConfirmedMessagesSurviveKill9AtTheirOffsets(t *testing.T) {
	if os.Getenv("LEPUS_BIN") == "" {
		t.Skip("Lepus only: needs a broker of the suite's own to kill (LEPUS_BIN)")
	}
	broker := restartable(t)
	env := environment(t, broker.url)
	name := declared(t, env)
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	var mu sync.Mutex
	confirmed := map[string]bool{}
	go func() {
		for statuses := range producer.NotifyPublishConfirmation() {
			mu.Lock()
			for _, status := range statuses {
				if status.IsConfirmed() {
					confirmed[string(status.GetMessage().GetData()[0])] = true
				}
			}
			mu.Unlock()
		}
	}()
	// Publish in order (one producer: body i is offset i) until a good number is confirmed.
	sent := 0
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		mu.Lock()
		done := len(confirmed)
		mu.Unlock()
		if done >= 2000 {
			break
		}
		if err := producer.Send(amqp.NewMessage([]byte(fmt.Sprintf("k-%d", sent)))); err != nil {
			break
		}
		sent++
	}
	broker.crash(t)
	mu.Lock()
	kept := map[string]bool{}
	for body := range confirmed {
		kept[body] = true
	}
	mu.Unlock()
	if len(kept) < 100 {
		t.Fatalf("only %d confirms before the kill", len(kept))
	}
	env = environment(t, broker.url)
	after := newReceived()
	consumer, err := env.NewConsumer(name, after.handler, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		t.Fatalf("consumer after the restart: %v", err)
	}
	defer consumer.Close()
	time.Sleep(2 * time.Second)
	after.mu.Lock()
	bodies, offsets := append([]string(nil), after.bodies...), append([]int64(nil), after.offsets...)
	after.mu.Unlock()
	for index, body := range bodies {
		if offsets[index] != int64(index) || body != fmt.Sprintf("k-%d", index) {
			t.Fatalf("after the kill, message %d is %q at offset %d", index, body, offsets[index])
		}
		delete(kept, body)
	}
	if len(kept) > 0 {
		t.Fatalf("%d confirmed messages lost in the kill (of %d read back, %d sent)", len(kept), len(bodies), sent)
	}
	// The next publish takes the next offset.
	again, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer after the restart: %v", err)
	}
	defer again.Close()
	publishConfirmed(t, again, again.NotifyPublishConfirmation(), "after")
	tail := consume(t, env, name, stream.OffsetSpecification{}.Offset(int64(len(bodies))))
	got, tailOffsets := tail.wait(t, 1)
	equal(t, "the message published after the restart", got, []string{"after"})
	equal(t, "its offset", tailOffsets, []int64{int64(len(bodies))})
}
