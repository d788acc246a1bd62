// queue-features: one producer and one consumer through amqp091-go on one queue declared with
// the arguments given, in safe mode (persistent messages, durable queue, publisher confirms with
// at most -max-pending outstanding, manual acks): the load behind bench/queue-features.sh, which
// compares a plain queue with TTL + dead-lettering, priorities and a single active consumer by the
// broker's CPU time per message. `lepus perf` declares its queues without arguments, hence this.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url := flag.String("url", "amqp://guest:guest@127.0.0.1:5672/", "broker URL")
	queue := flag.String("queue", "features", "queue name")
	arguments := flag.String("args", "{}", "queue arguments as JSON (integers become int32)")
	duration := flag.Duration("duration", 10*time.Second, "measured time")
	size := flag.Int("size", 16, "body bytes")
	priorities := flag.Int("priorities", 0, "publish with priority index % N (0: no priority property)")
	maxPending := flag.Int("max-pending", 1000, "most unconfirmed publishes")
	prefetch := flag.Int("prefetch", 1000, "consumer prefetch")
	flag.Parse()

	table := amqp.Table{}
	var raw map[string]interface{}
	if err := json.Unmarshal([]byte(*arguments), &raw); err != nil {
		log.Fatalf("-args: %v", err)
	}
	for key, value := range raw {
		if number, ok := value.(float64); ok {
			table[key] = int32(number)
		} else {
			table[key] = value
		}
	}
	setup := dial(*url)
	channel, err := setup.Channel()
	check(err, "channel")
	_, err = channel.QueueDeclare(*queue, true, false, false, false, table)
	check(err, "queue.declare")

	var consumed atomic.Int64
	consumerConnection := dial(*url)
	consumer, err := consumerConnection.Channel()
	check(err, "consumer channel")
	check(consumer.Qos(*prefetch, 0, false), "basic.qos")
	deliveries, err := consumer.Consume(*queue, "", false, false, false, false, nil)
	check(err, "basic.consume")
	go func() {
		for delivery := range deliveries {
			if err := delivery.Ack(false); err != nil {
				return
			}
			consumed.Add(1)
		}
	}()

	producerConnection := dial(*url)
	producer, err := producerConnection.Channel()
	check(err, "producer channel")
	check(producer.Confirm(false), "confirm.select")
	confirms := producer.NotifyPublish(make(chan amqp.Confirmation, *maxPending))
	body := make([]byte, *size)
	deadline := time.Now().Add(*duration)
	started := time.Now()
	startConsumed := consumed.Load()
	pending := 0
	for index := 0; time.Now().Before(deadline); index++ {
		for pending >= *maxPending {
			<-confirms
			pending--
		}
		publishing := amqp.Publishing{Body: body, DeliveryMode: amqp.Persistent}
		if *priorities > 0 {
			publishing.Priority = uint8(index % *priorities)
		}
		check(producer.Publish("", *queue, false, false, publishing), "basic.publish")
		pending++
	}
	elapsed := time.Since(started)
	completed := consumed.Load() - startConsumed
	fmt.Printf("completed %d in %.1f s (%.0f msg/s)\n", completed, elapsed.Seconds(), float64(completed)/elapsed.Seconds())
	_, _ = channel.QueueDelete(*queue, false, false, false)
	os.Exit(0)
}

func dial(url string) *amqp.Connection {
	connection, err := amqp.Dial(url)
	check(err, "connect")
	return connection
}

func check(err error, what string) {
	if err != nil {
		log.Fatalf("%s: %v", what, err)
	}
}
