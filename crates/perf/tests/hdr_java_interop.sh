#!/usr/bin/env bash
# Reads an HdrHistogram interval log written by `lepus perf --hdr` with HdrHistogram's own Java
# tool, HistogramLogProcessor (org.hdrhistogram:HdrHistogram from Maven Central), and prints its
# percentile distribution in microseconds.
#
# usage: hdr_java_interop.sh LOG_FILE TAG
# Exit 3 when java or mvn is missing (callers skip), non-zero on any other failure.
set -euo pipefail
log_file=$1
tag=$2
version=${HDRHISTOGRAM_VERSION:-2.2.2}
command -v java >/dev/null || { echo "java not found" >&2; exit 3; }
repository=${MAVEN_REPOSITORY:-$HOME/.m2/repository}
jar="$repository/org/hdrhistogram/HdrHistogram/$version/HdrHistogram-$version.jar"
if [[ ! -f $jar ]]; then
  command -v mvn >/dev/null || { echo "mvn not found and $jar missing" >&2; exit 3; }
  mvn -q -B dependency:get -Dartifact="org.hdrhistogram:HdrHistogram:$version" >&2
fi
# Values in the log are nanoseconds: a ratio of 1000 prints microseconds.
exec java -cp "$jar" org.HdrHistogram.HistogramLogProcessor \
  -i "$log_file" -tag "$tag" -outputValueUnitRatio 1000
