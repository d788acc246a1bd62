// connections: opens -count AMQP connections with one channel each and a -heartbeat interval,
// -concurrency at a time, holds them open, and reports how many opened, how many failed and how
// many the broker closed while held. It prints "barrier: all open" when every connection is open
// and waits for a line on stdin before holding them for -hold (so the calling script can read the
// broker's memory and run its latency probe first).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url := flag.String("url", "amqp://guest:guest@127.0.0.1:5672/", "broker URL")
	count := flag.Int("count", 19_000, "connections to open")
	concurrency := flag.Int("concurrency", 100, "connections being opened at once")
	heartbeat := flag.Duration("heartbeat", 10*time.Second, "heartbeat interval asked of the broker")
	hold := flag.Duration("hold", 60*time.Second, "how long to hold them all open")
	flag.Parse()

	var opened, failed, closedEarly atomic.Int64
	var firstError atomic.Value
	connections := make([]*amqp.Connection, *count)
	slots := make(chan struct{}, *concurrency)
	var group sync.WaitGroup
	start := time.Now()
	for index := 0; index < *count; index++ {
		slots <- struct{}{}
		group.Add(1)
		go func(index int) {
			defer group.Done()
			defer func() { <-slots }()
			connection, err := amqp.DialConfig(*url, amqp.Config{Heartbeat: *heartbeat, Properties: amqp.Table{"connection_name": fmt.Sprintf("held-%d", index)}})
			if err == nil {
				_, err = connection.Channel()
			}
			if err != nil {
				failed.Add(1)
				firstError.CompareAndSwap(nil, err.Error())
				return
			}
			connections[index] = connection
			opened.Add(1)
			closed := connection.NotifyClose(make(chan *amqp.Error, 1))
			go func() {
				if reason := <-closed; reason != nil {
					closedEarly.Add(1)
					firstError.CompareAndSwap(nil, reason.Error())
				}
			}()
		}(index)
	}
	group.Wait()
	fmt.Printf("opened %d, failed %d in %.1f s\n", opened.Load(), failed.Load(), time.Since(start).Seconds())
	if err := firstError.Load(); err != nil {
		fmt.Printf("first error: %v\n", err)
	}
	fmt.Println("barrier: all open")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		log.Printf("stdin: %v", err)
	}
	time.Sleep(*hold)
	fmt.Printf("held %s: %d of %d closed by the broker meanwhile\n", *hold, closedEarly.Load(), opened.Load())
	// The calling script reads the broker's CPU time and descriptors on that line: give it time
	// before the closes start costing the broker.
	time.Sleep(2 * time.Second)
	for _, connection := range connections {
		if connection != nil {
			connection.Close()
		}
	}
}
