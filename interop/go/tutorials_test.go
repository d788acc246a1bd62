package interop

// The RabbitMQ tutorials (https://www.rabbitmq.com/tutorials), written the way
// the official Go tutorial programs are written, but with unique names,
// bounded waits and assertions on what arrives.

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// failOnError mirrors the tutorials' helper, but fails the test.
func failOnError(t *testing.T, err error, msg string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %s", msg, err)
	}
}

// Tutorial 1: "Hello World!" (send.go / receive.go).
func TestTutorial1HelloWorld(t *testing.T) {
	queueName := uniqueName(t, "hello")
	cleanupQueue(t, queueName)

	// send.go
	{
		conn, err := amqp.Dial(amqpURL())
		failOnError(t, err, "Failed to connect to RabbitMQ")
		watchdog(t, conn)
		defer conn.Close()

		ch, err := conn.Channel()
		failOnError(t, err, "Failed to open a channel")
		defer ch.Close()

		q, err := ch.QueueDeclare(
			queueName, // name
			false,     // durable
			false,     // delete when unused
			false,     // exclusive
			false,     // no-wait
			nil,       // arguments
		)
		failOnError(t, err, "Failed to declare a queue")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()

		body := "Hello World!"
		err = ch.PublishWithContext(ctx,
			"",     // exchange
			q.Name, // routing key
			false,  // mandatory
			false,  // immediate
			amqp.Publishing{
				ContentType: "text/plain",
				Body:        []byte(body),
			})
		failOnError(t, err, "Failed to publish a message")
	}

	// receive.go
	conn, err := amqp.Dial(amqpURL())
	failOnError(t, err, "Failed to connect to RabbitMQ")
	watchdog(t, conn)
	defer conn.Close()

	ch, err := conn.Channel()
	failOnError(t, err, "Failed to open a channel")
	defer ch.Close()

	q, err := ch.QueueDeclare(queueName, false, false, false, false, nil)
	failOnError(t, err, "Failed to declare a queue")
	if q.Name != queueName || q.Messages != 1 || q.Consumers != 0 {
		t.Fatalf("declare-ok: want %s with 1 message 0 consumers, got %+v", queueName, q)
	}

	msgs, err := ch.Consume(
		q.Name, // queue
		"",     // consumer
		true,   // auto-ack
		false,  // exclusive
		false,  // no-local
		false,  // no-wait
		nil,    // args
	)
	failOnError(t, err, "Failed to register a consumer")

	d := receive(t, msgs)
	if string(d.Body) != "Hello World!" || d.ContentType != "text/plain" {
		t.Fatalf("got body %q content-type %q", d.Body, d.ContentType)
	}
	if d.Exchange != "" || d.RoutingKey != queueName || d.Redelivered {
		t.Fatalf("unexpected envelope: exchange %q key %q redelivered %v", d.Exchange, d.RoutingKey, d.Redelivered)
	}
	expectNoDelivery(t, msgs)
}

// Tutorial 2: Work queues (new_task.go / worker.go): durable queue,
// persistent messages, Qos(1,0,false), manual acks, fair dispatch between
// two workers.
func TestTutorial2WorkQueues(t *testing.T) {
	queueName := uniqueName(t, "task_queue")
	cleanupQueue(t, queueName)

	conn, err := amqp.Dial(amqpURL())
	failOnError(t, err, "Failed to connect to RabbitMQ")
	watchdog(t, conn)
	defer conn.Close()

	// Two workers, each on its own channel with prefetch 1.
	type done struct {
		worker int
		body   string
	}
	results := make(chan done, 100)
	var workerChans []*amqp.Channel
	for w := 1; w <= 2; w++ {
		ch, err := conn.Channel()
		failOnError(t, err, "Failed to open a channel")
		defer ch.Close()
		workerChans = append(workerChans, ch)

		q, err := ch.QueueDeclare(
			queueName, // name
			true,      // durable
			false,     // delete when unused
			false,     // exclusive
			false,     // no-wait
			nil,       // arguments
		)
		failOnError(t, err, "Failed to declare a queue")

		err = ch.Qos(
			1,     // prefetch count
			0,     // prefetch size
			false, // global
		)
		failOnError(t, err, "Failed to set QoS")

		msgs, err := ch.Consume(
			q.Name, // queue
			"",     // consumer
			false,  // auto-ack
			false,  // exclusive
			false,  // no-local
			false,  // no-wait
			nil,    // args
		)
		failOnError(t, err, "Failed to register a consumer")

		worker := w
		go func() {
			for d := range msgs {
				// "Simulate" work: one dot = 10 ms here instead of 1 s.
				dots := strings.Count(string(d.Body), ".")
				time.Sleep(time.Duration(dots) * 10 * time.Millisecond)
				results <- done{worker, string(d.Body)}
				_ = d.Ack(false)
			}
		}()
	}

	// new_task.go
	pch, err := conn.Channel()
	failOnError(t, err, "Failed to open a channel")
	defer pch.Close()
	var sent []string
	for i := 0; i < 10; i++ {
		body := fmt.Sprintf("task %d %s", i, strings.Repeat(".", i%3+1))
		sent = append(sent, body)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = pch.PublishWithContext(ctx,
			"",        // exchange
			queueName, // routing key
			false,     // mandatory
			false,
			amqp.Publishing{
				DeliveryMode: amqp.Persistent,
				ContentType:  "text/plain",
				Body:         []byte(body),
			})
		cancel()
		failOnError(t, err, "Failed to publish a message")
	}

	var got []string
	perWorker := map[int]int{}
	timeout := time.After(waitTimeout)
	for len(got) < len(sent) {
		select {
		case r := <-results:
			got = append(got, r.body)
			perWorker[r.worker]++
		case <-timeout:
			t.Fatalf("only %d of %d tasks were processed", len(got), len(sent))
		}
	}
	sort.Strings(got)
	sort.Strings(sent)
	if strings.Join(got, "|") != strings.Join(sent, "|") {
		t.Fatalf("processed tasks differ:\nwant %v\ngot  %v", sent, got)
	}
	if perWorker[1] == 0 || perWorker[2] == 0 {
		t.Fatalf("with prefetch 1 both workers must get work, got %v", perWorker)
	}

	// Everything was acked: the durable queue is empty.
	q, err := pch.QueueInspect(queueName)
	failOnError(t, err, "Failed to inspect queue")
	if q.Messages != 0 || q.Consumers != 2 {
		t.Fatalf("after all acks want 0 messages / 2 consumers, got %+v", q)
	}
	for _, ch := range workerChans {
		_ = ch.Close()
	}
}

// Tutorial 3: Publish/Subscribe (emit_log.go / receive_logs.go): a fanout
// exchange, every subscriber has an exclusive server-named queue.
func TestTutorial3PublishSubscribe(t *testing.T) {
	exchangeName := uniqueName(t, "logs")
	cleanupExchange(t, exchangeName)

	conn, err := amqp.Dial(amqpURL())
	failOnError(t, err, "Failed to connect to RabbitMQ")
	watchdog(t, conn)
	defer conn.Close()

	// Two receive_logs.go subscribers.
	var subs []<-chan amqp.Delivery
	var queueNames []string
	for i := 0; i < 2; i++ {
		ch, err := conn.Channel()
		failOnError(t, err, "Failed to open a channel")
		defer ch.Close()

		err = ch.ExchangeDeclare(
			exchangeName, // name
			"fanout",     // type
			true,         // durable
			false,        // auto-deleted
			false,        // internal
			false,        // no-wait
			nil,          // arguments
		)
		failOnError(t, err, "Failed to declare an exchange")

		q, err := ch.QueueDeclare(
			"",    // name
			false, // durable
			false, // delete when unused
			true,  // exclusive
			false, // no-wait
			nil,   // arguments
		)
		failOnError(t, err, "Failed to declare a queue")
		if !strings.HasPrefix(q.Name, "amq.gen-") {
			t.Fatalf("server-named queue should start with amq.gen-, got %q", q.Name)
		}
		queueNames = append(queueNames, q.Name)

		err = ch.QueueBind(
			q.Name,       // queue name
			"",           // routing key
			exchangeName, // exchange
			false,
			nil,
		)
		failOnError(t, err, "Failed to bind a queue")

		msgs, err := ch.Consume(q.Name, "", true, false, false, false, nil)
		failOnError(t, err, "Failed to register a consumer")
		subs = append(subs, msgs)
	}
	if queueNames[0] == queueNames[1] {
		t.Fatalf("server-named queues must be distinct, both are %q", queueNames[0])
	}

	// emit_log.go
	ch, err := conn.Channel()
	failOnError(t, err, "Failed to open a channel")
	defer ch.Close()
	err = ch.ExchangeDeclare(exchangeName, "fanout", true, false, false, false, nil)
	failOnError(t, err, "Failed to declare an exchange")
	for _, body := range []string{"info: one", "warning: two", "error: three"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = ch.PublishWithContext(ctx,
			exchangeName, // exchange
			"",           // routing key
			false,        // mandatory
			false,        // immediate
			amqp.Publishing{
				ContentType: "text/plain",
				Body:        []byte(body),
			})
		cancel()
		failOnError(t, err, "Failed to publish a message")
	}

	for i, msgs := range subs {
		got := bodies(receiveN(t, msgs, 3))
		if strings.Join(got, "|") != "info: one|warning: two|error: three" {
			t.Fatalf("subscriber %d got %v", i, got)
		}
		expectNoDelivery(t, msgs)
	}

	// Exclusive queues go away with their connection.
	_ = conn.Close()
	for _, name := range queueNames {
		waitUntil(t, "exclusive queue "+name+" is gone with its connection", func() bool { return !queueExists(name) })
	}
}

// Tutorial 4: Routing (emit_log_direct.go / receive_logs_direct.go).
func TestTutorial4Routing(t *testing.T) {
	exchangeName := uniqueName(t, "logs_direct")
	cleanupExchange(t, exchangeName)

	conn, err := amqp.Dial(amqpURL())
	failOnError(t, err, "Failed to connect to RabbitMQ")
	watchdog(t, conn)
	defer conn.Close()

	subscribe := func(severities ...string) <-chan amqp.Delivery {
		ch, err := conn.Channel()
		failOnError(t, err, "Failed to open a channel")
		t.Cleanup(func() { _ = ch.Close() })
		err = ch.ExchangeDeclare(exchangeName, "direct", true, false, false, false, nil)
		failOnError(t, err, "Failed to declare an exchange")
		q, err := ch.QueueDeclare("", false, false, true, false, nil)
		failOnError(t, err, "Failed to declare a queue")
		for _, s := range severities {
			err = ch.QueueBind(q.Name, s, exchangeName, false, nil)
			failOnError(t, err, "Failed to bind a queue")
		}
		msgs, err := ch.Consume(q.Name, "", true, false, false, false, nil)
		failOnError(t, err, "Failed to register a consumer")
		return msgs
	}
	errorsOnly := subscribe("error")
	all := subscribe("info", "warning", "error")

	ch, err := conn.Channel()
	failOnError(t, err, "Failed to open a channel")
	defer ch.Close()
	err = ch.ExchangeDeclare(exchangeName, "direct", true, false, false, false, nil)
	failOnError(t, err, "Failed to declare an exchange")
	for _, sev := range []string{"info", "warning", "error", "debug"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = ch.PublishWithContext(ctx, exchangeName, sev, false, false, amqp.Publishing{
			ContentType: "text/plain",
			Body:        []byte("a " + sev + " message"),
		})
		cancel()
		failOnError(t, err, "Failed to publish a message")
	}

	d := receive(t, errorsOnly)
	if string(d.Body) != "a error message" || d.RoutingKey != "error" || d.Exchange != exchangeName {
		t.Fatalf("error subscriber got %q key %q exchange %q", d.Body, d.RoutingKey, d.Exchange)
	}
	expectNoDelivery(t, errorsOnly)

	got := bodies(receiveN(t, all, 3))
	if strings.Join(got, "|") != "a info message|a warning message|a error message" {
		t.Fatalf("info/warning/error subscriber got %v", got)
	}
	expectNoDelivery(t, all) // "debug" had no binding and was dropped
}

// Tutorial 5: Topics (emit_log_topic.go / receive_logs_topic.go), with the
// tutorial's own binding keys "*.orange.*", "*.*.rabbit" and "lazy.#".
func TestTutorial5Topics(t *testing.T) {
	exchangeName := uniqueName(t, "logs_topic")
	cleanupExchange(t, exchangeName)

	conn, err := amqp.Dial(amqpURL())
	failOnError(t, err, "Failed to connect to RabbitMQ")
	watchdog(t, conn)
	defer conn.Close()

	subscribe := func(keys ...string) <-chan amqp.Delivery {
		ch, err := conn.Channel()
		failOnError(t, err, "Failed to open a channel")
		t.Cleanup(func() { _ = ch.Close() })
		err = ch.ExchangeDeclare(exchangeName, "topic", true, false, false, false, nil)
		failOnError(t, err, "Failed to declare an exchange")
		q, err := ch.QueueDeclare("", false, false, true, false, nil)
		failOnError(t, err, "Failed to declare a queue")
		for _, k := range keys {
			err = ch.QueueBind(q.Name, k, exchangeName, false, nil)
			failOnError(t, err, "Failed to bind a queue")
		}
		msgs, err := ch.Consume(q.Name, "", true, false, false, false, nil)
		failOnError(t, err, "Failed to register a consumer")
		return msgs
	}
	q1 := subscribe("*.orange.*")
	q2 := subscribe("*.*.rabbit", "lazy.#")
	hash := subscribe("#")

	ch, err := conn.Channel()
	failOnError(t, err, "Failed to open a channel")
	defer ch.Close()
	keys := []string{
		"quick.orange.rabbit",      // Q1, Q2
		"lazy.orange.elephant",     // Q1, Q2
		"quick.orange.fox",         // Q1
		"lazy.brown.fox",           // Q2
		"lazy.pink.rabbit",         // Q2 once (two matching bindings)
		"quick.brown.fox",          // none
		"orange",                   // none
		"quick.orange.male.rabbit", // none
		"lazy.orange.male.rabbit",  // Q2
		"lazy",                     // Q2 ("#" matches zero words)
	}
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = ch.PublishWithContext(ctx, exchangeName, k, false, false, amqp.Publishing{
			ContentType: "text/plain",
			Body:        []byte(k),
		})
		cancel()
		failOnError(t, err, "Failed to publish a message")
	}

	want1 := []string{"quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"}
	want2 := []string{"quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox", "lazy.pink.rabbit", "lazy.orange.male.rabbit", "lazy"}
	if got := bodies(receiveN(t, q1, len(want1))); strings.Join(got, "|") != strings.Join(want1, "|") {
		t.Fatalf("*.orange.* got %v, want %v", got, want1)
	}
	expectNoDelivery(t, q1)
	if got := bodies(receiveN(t, q2, len(want2))); strings.Join(got, "|") != strings.Join(want2, "|") {
		t.Fatalf("*.*.rabbit + lazy.# got %v, want %v", got, want2)
	}
	expectNoDelivery(t, q2)
	if got := bodies(receiveN(t, hash, len(keys))); strings.Join(got, "|") != strings.Join(keys, "|") {
		t.Fatalf("# got %v, want %v", got, keys)
	}
}

func fib(n int) int {
	if n == 0 {
		return 0
	} else if n == 1 {
		return 1
	}
	return fib(n-1) + fib(n-2)
}

// Tutorial 6: RPC (rpc_server.go / rpc_client.go) with reply_to and
// correlation_id.
func TestTutorial6RPC(t *testing.T) {
	rpcQueue := uniqueName(t, "rpc_queue")
	cleanupQueue(t, rpcQueue)

	// rpc_server.go
	sconn, err := amqp.Dial(amqpURL())
	failOnError(t, err, "Failed to connect to RabbitMQ")
	watchdog(t, sconn)
	defer sconn.Close()
	sch, err := sconn.Channel()
	failOnError(t, err, "Failed to open a channel")
	defer sch.Close()
	q, err := sch.QueueDeclare(
		rpcQueue, // name
		false,    // durable
		false,    // delete when unused
		false,    // exclusive
		false,    // no-wait
		nil,      // arguments
	)
	failOnError(t, err, "Failed to declare a queue")
	err = sch.Qos(1, 0, false)
	failOnError(t, err, "Failed to set QoS")
	msgs, err := sch.Consume(q.Name, "", false, false, false, false, nil)
	failOnError(t, err, "Failed to register a consumer")

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for d := range msgs {
			n, err := strconv.Atoi(string(d.Body))
			if err != nil {
				t.Errorf("Failed to convert body to integer: %v", err)
				return
			}
			response := fib(n)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = sch.PublishWithContext(ctx,
				"",        // exchange
				d.ReplyTo, // routing key
				false,     // mandatory
				false,     // immediate
				amqp.Publishing{
					ContentType:   "text/plain",
					CorrelationId: d.CorrelationId,
					Body:          []byte(strconv.Itoa(response)),
				})
			cancel()
			if err != nil {
				t.Errorf("Failed to publish a message: %v", err)
			}
			_ = d.Ack(false)
		}
	}()

	// rpc_client.go
	conn, err := amqp.Dial(amqpURL())
	failOnError(t, err, "Failed to connect to RabbitMQ")
	watchdog(t, conn)
	defer conn.Close()
	ch, err := conn.Channel()
	failOnError(t, err, "Failed to open a channel")
	defer ch.Close()
	cq, err := ch.QueueDeclare(
		"",    // name
		false, // durable
		false, // delete when unused
		true,  // exclusive
		false, // noWait
		nil,   // arguments
	)
	failOnError(t, err, "Failed to declare a queue")
	replies, err := ch.Consume(cq.Name, "", true, false, false, false, nil)
	failOnError(t, err, "Failed to register a consumer")

	for _, n := range []int{0, 1, 10, 20} {
		corrID := uniqueName(t, "corr")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = ch.PublishWithContext(ctx,
			"",       // exchange
			rpcQueue, // routing key
			false,    // mandatory
			false,    // immediate
			amqp.Publishing{
				ContentType:   "text/plain",
				CorrelationId: corrID,
				ReplyTo:       cq.Name,
				Body:          []byte(strconv.Itoa(n)),
			})
		cancel()
		failOnError(t, err, "Failed to publish a message")

		d := receive(t, replies)
		if d.CorrelationId != corrID {
			t.Fatalf("correlation id: want %q, got %q", corrID, d.CorrelationId)
		}
		res, err := strconv.Atoi(string(d.Body))
		failOnError(t, err, "Failed to convert body to integer")
		if res != fib(n) {
			t.Fatalf("fib(%d): want %d, got %d", n, fib(n), res)
		}
	}
	_ = sch.Close() // ends the server goroutine's range over msgs
	wg.Wait()
}

// Tutorial 7: Publisher confirms, strategy 1: publish one message and wait
// for its confirmation (Confirm(false) + NotifyPublish).
func TestTutorial7ConfirmsIndividuallyNotifyPublish(t *testing.T) {
	_, ch := connChannel(t)
	q := declareQueue(t, ch, "confirms")

	failOnError(t, ch.Confirm(false), "Failed to put the channel in confirm mode")
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))

	for i := 1; i <= 50; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := ch.PublishWithContext(ctx, "", q.Name, false, false, amqp.Publishing{
			ContentType: "text/plain",
			Body:        []byte(fmt.Sprintf("message %d", i)),
		})
		cancel()
		failOnError(t, err, "Failed to publish a message")
		select {
		case c := <-confirms:
			if !c.Ack {
				t.Fatalf("message %d was nacked", i)
			}
			if c.DeliveryTag != uint64(i) {
				t.Fatalf("confirm delivery tag: want %d, got %d", i, c.DeliveryTag)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("no confirm for message %d within %s", i, waitTimeout)
		}
	}
	assertMessageCount(t, ch, q.Name, 50)
}

// Tutorial 7, strategy 2: publish a batch of 100 and wait for all confirms
// (Confirm(false) + NotifyPublish).
func TestTutorial7ConfirmsBatchNotifyPublish(t *testing.T) {
	_, ch := connChannel(t)
	q := declareQueue(t, ch, "confirms")

	failOnError(t, ch.Confirm(false), "Failed to put the channel in confirm mode")
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 300))

	const batchSize = 100
	for batch := 0; batch < 3; batch++ {
		for i := 0; i < batchSize; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := ch.PublishWithContext(ctx, "", q.Name, false, false, amqp.Publishing{
				ContentType: "text/plain",
				Body:        []byte(fmt.Sprintf("batch %d message %d", batch, i)),
			})
			cancel()
			failOnError(t, err, "Failed to publish a message")
		}
		// NotifyPublish delivers confirmations in publish order, one per
		// message, even when the broker acks several with multiple=true.
		timeout := time.After(waitTimeout)
		for i := 1; i <= batchSize; i++ {
			select {
			case c := <-confirms:
				if !c.Ack {
					t.Fatalf("batch %d: message %d was nacked", batch, c.DeliveryTag)
				}
				if want := uint64(batch*batchSize + i); c.DeliveryTag != want {
					t.Fatalf("confirm delivery tag: want %d, got %d", want, c.DeliveryTag)
				}
			case <-timeout:
				t.Fatalf("batch %d: only %d of %d confirms within %s", batch, i-1, batchSize, waitTimeout)
			}
		}
	}
	assertMessageCount(t, ch, q.Name, 3*batchSize)
}

// Tutorial 7 with PublishWithDeferredConfirmWithContext, one at a time.
func TestTutorial7DeferredConfirmIndividually(t *testing.T) {
	_, ch := connChannel(t)
	q := declareQueue(t, ch, "confirms")
	failOnError(t, ch.Confirm(false), "Failed to put the channel in confirm mode")

	for i := 1; i <= 50; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false, amqp.Publishing{
			ContentType: "text/plain",
			Body:        []byte(fmt.Sprintf("message %d", i)),
		})
		failOnError(t, err, "Failed to publish a message")
		if dc == nil {
			t.Fatalf("no deferred confirmation on a confirm-mode channel")
		}
		if dc.DeliveryTag != uint64(i) {
			t.Fatalf("deferred confirmation tag: want %d, got %d", i, dc.DeliveryTag)
		}
		acked, err := dc.WaitContext(ctx)
		cancel()
		failOnError(t, err, "Failed waiting for the confirmation")
		if !acked {
			t.Fatalf("message %d was nacked", i)
		}
	}
	assertMessageCount(t, ch, q.Name, 50)
}

// Tutorial 7 with PublishWithDeferredConfirmWithContext in batches of 100.
func TestTutorial7DeferredConfirmBatches(t *testing.T) {
	_, ch := connChannel(t)
	q := declareQueue(t, ch, "confirms")
	failOnError(t, ch.Confirm(false), "Failed to put the channel in confirm mode")

	const batchSize = 100
	for batch := 0; batch < 3; batch++ {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		pending := make([]*amqp.DeferredConfirmation, 0, batchSize)
		for i := 0; i < batchSize; i++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false, amqp.Publishing{
				ContentType: "text/plain",
				Body:        []byte(fmt.Sprintf("batch %d message %d", batch, i)),
			})
			failOnError(t, err, "Failed to publish a message")
			pending = append(pending, dc)
		}
		for _, dc := range pending {
			acked, err := dc.WaitContext(ctx)
			failOnError(t, err, "Failed waiting for a confirmation")
			if !acked {
				t.Fatalf("batch %d: message %d was nacked", batch, dc.DeliveryTag)
			}
		}
		cancel()
	}
	assertMessageCount(t, ch, q.Name, 3*batchSize)
}
