"""dpledger.mechanisms"""
