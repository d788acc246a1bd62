// delayed-million: publishes -count persistent messages to a durable x-delayed-message exchange,
// due spread evenly over -spread starting -lead after the start (so all are pending once the
// publishing ends), confirmed with -max-pending outstanding; then waits at the barrier line (the
// calling script reads the broker's memory there), consumes them all, and prints how late each
// arrived against the due time the client asked for (arrival minus due, which includes the time
// the publish took to reach the broker and the delivery itself: the broker's own timer lateness is
// its lepus_delayed_lateness_seconds metric).
package main

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url := flag.String("url", "amqp://guest:guest@127.0.0.1:5672/", "broker URL")
	count := flag.Int("count", 1_000_000, "delayed messages")
	lead := flag.Duration("lead", 240*time.Second, "time from the start to the first due time")
	spread := flag.Duration("spread", 60*time.Second, "due times spread over this long")
	maxPending := flag.Int("max-pending", 1000, "most unconfirmed publishes")
	size := flag.Int("size", 64, "body bytes (the first 8 hold the due time in ms)")
	flag.Parse()

	connection, err := amqp.Dial(*url)
	check(err, "connect")
	channel, err := connection.Channel()
	check(err, "channel")
	check(channel.ExchangeDeclare("delayed-million", "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "direct"}), "exchange.declare")
	_, err = channel.QueueDeclare("delayed-million", true, false, false, false, nil)
	check(err, "queue.declare")
	check(channel.QueueBind("delayed-million", "k", "delayed-million", false, nil), "queue.bind")
	check(channel.Confirm(false), "confirm.select")
	confirms := channel.NotifyPublish(make(chan amqp.Confirmation, *maxPending))

	start := time.Now()
	first := start.Add(*lead)
	pending := 0
	for index := 0; index < *count; index++ {
		for pending >= *maxPending {
			if confirmation := <-confirms; !confirmation.Ack {
				log.Fatalf("publish %d nacked", confirmation.DeliveryTag)
			}
			pending--
		}
		due := first.Add(time.Duration(int64(*spread) * int64(index) / int64(*count)))
		body := make([]byte, *size)
		binary.BigEndian.PutUint64(body, uint64(due.UnixMilli()))
		delay := time.Until(due).Milliseconds()
		publishing := amqp.Publishing{Body: body, DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-delay": delay}}
		check(channel.Publish("delayed-million", "k", false, false, publishing), "basic.publish")
		pending++
	}
	for ; pending > 0; pending-- {
		<-confirms
	}
	published := time.Since(start)
	fmt.Printf("published %d in %.1f s (%.0f msg/s); first due in %.1f s\n", *count, published.Seconds(),
		float64(*count)/published.Seconds(), time.Until(first).Seconds())
	fmt.Println("barrier: all published")
	// The script reads the broker's memory now, then says go on.
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')

	consumer, err := connection.Channel()
	check(err, "consumer channel")
	check(consumer.Qos(5000, 0, false), "basic.qos")
	deliveries, err := consumer.Consume("delayed-million", "", false, false, false, false, nil)
	check(err, "basic.consume")
	lateness := make([]int64, 0, *count)
	early := 0
	for delivery := range deliveries {
		arrived := time.Now().UnixMilli()
		due := int64(binary.BigEndian.Uint64(delivery.Body))
		if arrived < due {
			early++
		}
		lateness = append(lateness, arrived-due)
		if len(lateness)%1000 == 0 || len(lateness) == *count {
			check(delivery.Ack(true), "basic.ack")
		}
		if len(lateness) == *count {
			break
		}
	}
	sort.Slice(lateness, func(a, b int) bool { return lateness[a] < lateness[b] })
	at := func(fraction float64) int64 { return lateness[int(fraction*float64(len(lateness)-1))] }
	// Early arrivals are the millisecond truncations of the client's x-delay and the broker's clock.
	fmt.Printf("received %d; client-side lateness ms: min %d, p50 %d, p99 %d, p99.9 %d, max %d; %d arrived before the client's due time\n",
		len(lateness), lateness[0], at(0.5), at(0.99), at(0.999), lateness[len(lateness)-1], early)
}

func check(err error, what string) {
	if err != nil {
		log.Fatalf("%s: %v", what, err)
	}
}
