package streaminterop

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

func bodies(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

func offsetsFrom(first int64, count int) []int64 {
	var out []int64
	for i := 0; i < count; i++ {
		out = append(out, first+int64(i))
	}
	return out
}

func equal[T comparable](t *testing.T, what string, got, want []T) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func TestCreateAndDeleteStreamAndTheirRefusals(t *testing.T) {
	env := environment(t, streamURL())
	name := streamName(t, env)
	options := func() *stream.StreamOptions {
		return stream.NewStreamOptions().SetMaxAge(time.Hour).SetMaxLengthBytes(stream.ByteCapacity{}.GB(1))
	}
	if err := env.DeclareStream(name, options()); err != nil {
		t.Fatalf("declare: %v", err)
	}
	if exists, err := env.StreamExists(name); err != nil || !exists {
		t.Fatalf("exists after declare: %v %v", exists, err)
	}
	// STREAM_ALREADY_EXISTS, which the client takes as done.
	if err := env.DeclareStream(name, options()); err != nil {
		t.Fatalf("declaring it again alike: %v, want no error", err)
	}
	// RabbitMQ 3.10.8 answers a declaration with other arguments PRECONDITION_FAILED.
	if err := env.DeclareStream(name, stream.NewStreamOptions().SetMaxLengthBytes(stream.ByteCapacity{}.GB(2))); !errors.Is(err, stream.PreconditionFailed) {
		t.Fatalf("declaring it again with other arguments: %v, want PreconditionFailed", err)
	}
	if err := env.DeclareStream("amq.lepus-go-stream", nil); !errors.Is(err, stream.PreconditionFailed) {
		t.Fatalf("declaring an amq. name: %v, want PreconditionFailed", err)
	}
	if err := env.DeleteStream(name); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := env.DeleteStream(name); !errors.Is(err, stream.StreamDoesNotExist) {
		t.Fatalf("deleting it again: %v, want StreamDoesNotExist", err)
	}
	if exists, err := env.StreamExists(name); err != nil || exists {
		t.Fatalf("exists after delete: %v %v", exists, err)
	}
}

func TestPublishWithConfirmsAndConsumeFromFirst(t *testing.T) {
	env := environment(t, streamURL())
	name := declared(t, env)
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()
	confirms := producer.NotifyPublishConfirmation()
	want := bodies("m", 0, 100)
	var batch []message.StreamMessage
	for _, body := range want {
		batch = append(batch, amqp.NewMessage([]byte(body)))
	}
	if err := producer.BatchSend(batch); err != nil {
		t.Fatalf("batch send: %v", err)
	}
	waitConfirmed(t, confirms, len(want))
	got, offsets := consume(t, env, name, stream.OffsetSpecification{}.First()).wait(t, len(want))
	equal(t, "bodies", got, want)
	equal(t, "offsets", offsets, offsetsFrom(0, len(want)))
}

func TestDeduplicationByPublisherReference(t *testing.T) {
	env := environment(t, streamURL())
	name := declared(t, env)
	send := func(reference string, ids ...int64) {
		t.Helper()
		producer, err := env.NewProducer(name, stream.NewProducerOptions().SetProducerName(reference))
		if err != nil {
			t.Fatalf("producer %s: %v", reference, err)
		}
		defer producer.Close()
		confirms := producer.NotifyPublishConfirmation()
		for _, id := range ids {
			message := amqp.NewMessage([]byte(fmt.Sprintf("id-%d", id)))
			message.SetPublishingId(id)
			if err := producer.Send(message); err != nil {
				t.Fatalf("send %d: %v", id, err)
			}
		}
		// Duplicates are confirmed too: the broker drops them, the publisher is answered.
		waitConfirmed(t, confirms, len(ids))
	}
	if sequence, err := env.QuerySequence("lepus-dedup", name); err != nil || sequence != 0 {
		t.Fatalf("sequence of an unknown reference: %d %v, want 0", sequence, err)
	}
	send("lepus-dedup", 1, 2, 3, 4, 5)
	if sequence, err := env.QuerySequence("lepus-dedup", name); err != nil || sequence != 5 {
		t.Fatalf("sequence after 1..5: %d %v, want 5", sequence, err)
	}
	// A publisher that comes back resends 3..5 (lost confirms, say) and goes on with 6..7.
	send("lepus-dedup", 3, 4, 5, 6, 7)
	if sequence, err := env.QuerySequence("lepus-dedup", name); err != nil || sequence != 7 {
		t.Fatalf("sequence after the resend: %d %v, want 7", sequence, err)
	}
	got, offsets := consume(t, env, name, stream.OffsetSpecification{}.First()).wait(t, 7)
	equal(t, "bodies", got, []string{"id-1", "id-2", "id-3", "id-4", "id-5", "id-6", "id-7"})
	equal(t, "offsets", offsets, offsetsFrom(0, 7))
}

func TestSubscribeFromEveryOffsetKind(t *testing.T) {
	env := environment(t, streamURL())
	name := declared(t, env)
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()
	confirms := producer.NotifyPublishConfirmation()
	// One chunk per message (each waits for its confirm), and a clear gap in time before m-5.
	publishConfirmed(t, producer, confirms, bodies("m", 0, 5)...)
	time.Sleep(1100 * time.Millisecond)
	gap := time.Now().UnixMilli()
	time.Sleep(100 * time.Millisecond)
	publishConfirmed(t, producer, confirms, bodies("m", 5, 10)...)

	t.Run("first", func(t *testing.T) {
		got, offsets := consume(t, env, name, stream.OffsetSpecification{}.First()).wait(t, 10)
		equal(t, "bodies", got, bodies("m", 0, 10))
		equal(t, "offsets", offsets, offsetsFrom(0, 10))
	})
	t.Run("offset", func(t *testing.T) {
		got, offsets := consume(t, env, name, stream.OffsetSpecification{}.Offset(6)).wait(t, 4)
		equal(t, "bodies", got, bodies("m", 6, 10))
		equal(t, "offsets", offsets, offsetsFrom(6, 4))
	})
	t.Run("last", func(t *testing.T) {
		// The last chunk holds m-9 alone.
		got, offsets := consume(t, env, name, stream.OffsetSpecification{}.Last()).wait(t, 1)
		equal(t, "bodies", got, []string{"m-9"})
		equal(t, "offsets", offsets, []int64{9})
	})
	t.Run("timestamp", func(t *testing.T) {
		got, offsets := consume(t, env, name, stream.OffsetSpecification{}.Timestamp(gap)).wait(t, 5)
		equal(t, "bodies", got, bodies("m", 5, 10))
		equal(t, "offsets", offsets, offsetsFrom(5, 5))
	})
	t.Run("next", func(t *testing.T) {
		next := consume(t, env, name, stream.OffsetSpecification{}.Next())
		// Subscribed: nothing of what is there arrives; what is published next does.
		time.Sleep(quietPeriod)
		publishConfirmed(t, producer, confirms, "m-10")
		got, offsets := next.wait(t, 1)
		equal(t, "bodies", got, []string{"m-10"})
		equal(t, "offsets", offsets, []int64{10})
	})
}

func TestSeveralConsumersEachReadEverything(t *testing.T) {
	env := environment(t, streamURL())
	name := declared(t, env)
	early := []*received{consume(t, env, name, stream.OffsetSpecification{}.Next()), consume(t, env, name, stream.OffsetSpecification{}.First())}
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()
	confirms := producer.NotifyPublishConfirmation()
	want := bodies("fan", 0, 50)
	for _, body := range want {
		if err := producer.Send(amqp.NewMessage([]byte(body))); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	waitConfirmed(t, confirms, len(want))
	late := consume(t, env, name, stream.OffsetSpecification{}.First())
	for index, consumer := range append(early, late) {
		got, offsets := consumer.wait(t, len(want))
		equal(t, fmt.Sprintf("consumer %d bodies", index), got, want)
		equal(t, fmt.Sprintf("consumer %d offsets", index), offsets, offsetsFrom(0, len(want)))
	}
}

func TestStoredOffsetsSurviveARestart(t *testing.T) {
	broker := restartable(t)
	env := environment(t, broker.url)
	name := declared(t, env)
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	confirms := producer.NotifyPublishConfirmation()
	publishConfirmed(t, producer, confirms, bodies("m", 0, 10)...)
	_ = producer.Close()
	if _, err := env.QueryOffset("lepus-tracker", name); !errors.Is(err, stream.OffsetNotFoundError) {
		t.Fatalf("query of a reference never stored: %v, want OffsetNotFoundError", err)
	}
	if err := env.StoreOffset("lepus-tracker", name, 6); err != nil {
		t.Fatalf("store offset: %v", err)
	}
	// Store offset has no answer: wait until it is readable.
	deadline := time.Now().Add(waitTimeout)
	for {
		offset, err := env.QueryOffset("lepus-tracker", name)
		if err == nil && offset == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored offset: %d %v, want 6", offset, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = env.Close()
	broker.restart(t)
	env = environment(t, broker.url)
	offset, err := env.QueryOffset("lepus-tracker", name)
	if err != nil || offset != 6 {
		t.Fatalf("stored offset after the restart: %d %v, want 6", offset, err)
	}
	got, offsets := consume(t, env, name, stream.OffsetSpecification{}.Offset(offset+1)).wait(t, 3)
	equal(t, "bodies", got, bodies("m", 7, 10))
	equal(t, "offsets", offsets, offsetsFrom(7, 3))
}

func TestMetadataNamesThisBrokerAsLeader(t *testing.T) {
	env := environment(t, streamURL())
	name := declared(t, env)
	metadata, err := env.StreamMetaData(name)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	_, port := hostPort(t, streamURL())
	if metadata.Leader == nil || metadata.Leader.Port != fmt.Sprint(port) || len(metadata.Replicas) != 0 {
		t.Fatalf("metadata of a one-node stream: leader %+v replicas %+v, want the URL's port %d and no replica", metadata.Leader, metadata.Replicas, port)
	}
	if _, err := env.StreamMetaData(name + ".missing"); !errors.Is(err, stream.StreamDoesNotExist) {
		t.Fatalf("metadata of a missing stream: %v, want StreamDoesNotExist", err)
	}
}

func TestRefusals(t *testing.T) {
	env := environment(t, streamURL())
	missing := streamName(t, env) + ".missing"
	if _, err := env.NewProducer(missing, nil); !errors.Is(err, stream.StreamDoesNotExist) {
		t.Fatalf("producer on a missing stream: %v, want StreamDoesNotExist", err)
	}
	if _, err := env.NewConsumer(missing, newReceived().handler, nil); !errors.Is(err, stream.StreamDoesNotExist) {
		t.Fatalf("consumer on a missing stream: %v, want StreamDoesNotExist", err)
	}
	host, port := hostPort(t, streamURL())
	if _, err := openEnvironment(t, fmt.Sprintf("rabbitmq-stream://guest:wrong@%s:%d/%%2f", host, port)); !errors.Is(err, stream.AuthenticationFailure) {
		t.Fatalf("wrong password: %v, want AuthenticationFailure", err)
	}
	if _, err := openEnvironment(t, fmt.Sprintf("rabbitmq-stream://guest:guest@%s:%d/no-such-vhost", host, port)); !errors.Is(err, stream.VirtualHostAccessFailure) {
		t.Fatalf("unknown vhost: %v, want VirtualHostAccessFailure", err)
	}
}
