module lepus/bench/connections

go 1.21

require github.com/rabbitmq/amqp091-go v1.16.0
