"""dpledger.sampling"""
