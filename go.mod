module github.com/hvdd/hvdd

go 1.26.8

require (
	golang.org/x/sys v0.49.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
