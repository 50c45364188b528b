# Convenience targets; scripts/ holds the real logic.
.PHONY: build test demo proto fuzz

build:
	go build -o bin/hvdd ./cmd/hvdd

test:
	./scripts/test.sh

demo:
	./scripts/demo.sh

# Regenerates the Go and Python protobuf code from ipc/ipcpb/hvdd.proto.
# Needs protoc (apt-get install protobuf-compiler) and
# protoc-gen-go (go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12).
proto:
	protoc --go_out=. --go_opt=module=github.com/hvdd/hvdd -Iipc/ipcpb ipc/ipcpb/hvdd.proto
	protoc --go_out=. --go_opt=module=github.com/hvdd/hvdd -Icluster/clusterpb cluster/clusterpb/cluster.proto
	[ ! -x clients/python/gen_proto.sh ] || clients/python/gen_proto.sh

fuzz:
	FUZZTIME=60s ./scripts/test.sh
