#!/bin/bash
D=${D:-/tmp/q3/data}
for i in 1 2 3; do [ -f $D/n$i.pid ] && kill $(cat $D/n$i.pid) 2>/dev/null; done
for i in 1 2 3; do [ -f $D/n$i.pid ] && while kill -0 $(cat $D/n$i.pid) 2>/dev/null; do sleep 0.2; done; done
true
