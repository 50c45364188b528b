"""Protocol messages generated from ipc/ipcpb/hvdd.proto (see gen_proto.sh)."""
