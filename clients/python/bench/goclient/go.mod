module github.com/hvdd/hvdd/clients/python/bench/goclient

go 1.26.8

require github.com/hvdd/hvdd v0.0.0

require (
	golang.org/x/sys v0.49.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/hvdd/hvdd => ../../../..
